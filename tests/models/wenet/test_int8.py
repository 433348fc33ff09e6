"""int8 weights on the WeNet Conformer: what stays at full precision, and what int8 keeps of fp32."""

from __future__ import annotations

import torch

import oasr
from oasr.layers.quant import is_quantized, quantize_model_int8

from .conftest import CLIPS


def _fixture_log_probs(model, refs):
    out = []
    with torch.inference_mode():
        for clip in CLIPS:
            fbank = refs[clip]["fbank"]
            log_probs, _ = model.forward_offline(fbank[None], torch.tensor([fbank.shape[0]]))
            out.append(log_probs[0])
    return out


def test_int8_keeps_the_ctc_head_the_embed_and_attention_output_projections_at_full_precision(model_dir):
    model = oasr.load_pretrained(model_dir).model
    section = quantize_model_int8(model)
    assert is_quantized(model)
    assert "encoder.encoders.0.feed_forward.w_1" in section["layers"]
    assert not any(name.startswith(("ctc", "encoder.embed"))
                   or (name.startswith("encoder.") and name.endswith("self_attn.linear_out"))
                   for name in section["layers"]), section["layers"]
    assert "encoder.encoders.0.self_attn.linear_v" in section["layers"]
    assert model.ctc.ctc_lo.weight.dtype == torch.float32


def test_int8_keeps_every_confident_fp32_ctc_frame(model_dir, refs):
    """On the fixture audio, every frame whose fp32 argmax leads by more than 0.1 (far above int8's
    rounding of these logits) keeps its argmax under int8, and >= 95 % of all frames do."""
    fp32 = _fixture_log_probs(oasr.load_pretrained(model_dir).model, refs)
    model = oasr.load_pretrained(model_dir).model
    quantize_model_int8(model)
    int8 = _fixture_log_probs(model, refs)
    same = total = confident = 0
    for a, b in zip(fp32, int8, strict=True):
        top2 = a.topk(2, dim=-1).values
        sure = (top2[:, 0] - top2[:, 1]) > 0.1
        agree = a.argmax(-1) == b.argmax(-1)
        assert bool(agree[sure].all()), f"int8 flipped {int((~agree[sure]).sum())} confident frame(s)"
        same, total, confident = same + int(agree.sum()), total + agree.numel(), confident + int(sure.sum())
    assert confident >= total // 2  # the guard leaves most frames compared
    assert same / total >= 0.95, f"int8 kept {same}/{total} fp32 argmax frames"
