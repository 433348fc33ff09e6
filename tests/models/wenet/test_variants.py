"""Conformer variants the fixture does not cover (conv2d6/8, batch norm, non-causal, no macaron, relu).

No WeNet reference exists for these here, so they are held to properties WeNet's own code has (its
fixture records them for the causal release): WeNet's key layout loads strictly, a padded batch equals
each utterance alone, and a causal model's chunk-by-chunk output equals its chunk-masked offline output.
"""

from __future__ import annotations

import attrs
import pytest
import torch
from torch.nn.utils.rnn import pad_sequence

from oasr.errors import CapabilityError
from oasr_models_wenet.config import ConformerEncoderConfig, ConformerModelConfig, TransformerDecoderConfig
from oasr_models_wenet.model import ConformerModel

from ._helpers import assert_rel

VARIANTS = {
    "conv2d6-batchnorm-causal": dict(input_layer="conv2d6", cnn_module_norm="batch_norm", causal=True),
    "conv2d8-relu-causal": dict(input_layer="conv2d8", activation_type="relu", causal=True),
    "conv2d-nomacaron-causal": dict(macaron_style=False, causal=True, cnn_module_norm="layer_norm"),
    "conv2d-noncausal-batchnorm": dict(causal=False),
    "conv2d-nocnn": dict(use_cnn_module=False),
}
WENET_NAMES = {"conv2d": "encoder.embed.out.0.", "conv2d6": "encoder.embed.linear.", "conv2d8": "encoder.embed.linear."}


def _model(variant: str, decoder: bool = False) -> ConformerModel:
    encoder = ConformerEncoderConfig(input_dim=24, output_size=32, attention_heads=4, linear_units=40, num_blocks=2,
                                     cnn_module_kernel=7, use_dynamic_chunk=True, **VARIANTS[variant])
    dec = TransformerDecoderConfig(vocab_size=9, d_model=32, attention_heads=4, linear_units=40, num_blocks=1,
                                   sos_id=8, eos_id=8) if decoder else None
    torch.manual_seed(3)
    model = ConformerModel(ConformerModelConfig(vocab_size=9, encoder=encoder, decoder=dec)).eval()
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if name.endswith(("pos_bias_u", "pos_bias_v", "running_mean", "global_cmvn.mean")):
                tensor.normal_(0, 0.3)
            elif name.endswith(("running_var", "global_cmvn.istd")):
                tensor.uniform_(0.5, 2.0)
    return model


def _feats(*lengths: int) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    rows = [torch.randn(n, 24) * 2 + 1 for n in lengths]
    return pad_sequence(rows, batch_first=True), torch.tensor(lengths)


@pytest.mark.parametrize("variant", VARIANTS)
def test_wenet_key_layout_loads_strictly(variant):
    model = _model(variant, decoder=True)
    kind = model.config.encoder.input_layer
    wenet = {}
    for key, value in model.state_dict().items():
        key = key.replace("encoder.embed.out.", WENET_NAMES[kind])
        wenet[key] = value.clone()
    wenet["encoder.embed.pos_enc.pe"] = torch.zeros(1, 5000, 32)  # WeNet saves its positional tables
    assert any(k.startswith(WENET_NAMES[kind]) for k in wenet)
    fresh = _model(variant, decoder=True)
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    report = fresh.load_weights(wenet)
    assert report.missing == [] and report.dropped == ["encoder.embed.pos_enc.pe"]
    for key, value in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key


@pytest.mark.parametrize("variant", VARIANTS)
def test_padded_batch_equals_each_utterance(variant):
    model = _model(variant)
    feats, lens = _feats(113, 70, 29)
    with torch.no_grad():
        batched, out_lens = model.encode_offline(feats, lens)
        for row in range(3):
            alone, n = model.encode_offline(feats[row:row + 1, :lens[row]], lens[row:row + 1])
            assert int(out_lens[row]) == int(n) == alone.size(1)
            assert_rel(batched[row, :alone.size(1)], alone[0], 1e-5)


@pytest.mark.parametrize("variant", [v for v, kw in VARIANTS.items() if kw.get("causal")])
@pytest.mark.parametrize("left", [-1, 1])
def test_causal_chunk_by_chunk_equals_chunk_masked_offline(variant, left):
    model = _model(variant)
    feats, lens = _feats(150, 97)
    with torch.no_grad():
        masked, masked_lens = model.encoder(feats, lens, chunk_size=3, num_left_chunks=left)
        streamed, streamed_lens = model.encoder.forward_chunk_by_chunk(feats, lens, 3, left)
    assert torch.equal(masked_lens, streamed_lens)
    for row in range(2):
        n = int(masked_lens[row])
        assert_rel(streamed[row, :n], masked[row, :n], 1e-5)


def test_output_lengths_follow_wenets_mask_slicing():
    """WeNet subsamples its padding mask by slicing (``[2::2]``, ``[4::3]``); the conv arithmetic agrees."""
    slicing = {"conv2d": ((2, 2), (2, 2)), "conv2d6": ((2, 2), (4, 3)), "conv2d8": ((2, 2), (2, 2), (2, 2))}
    for kind, steps in slicing.items():
        model = _model(next(v for v, kw in VARIANTS.items() if kw.get("input_layer", "conv2d") == kind))
        for n in range(1, 60):
            mask = list(range(n))
            for start, step in steps:
                mask = mask[start::step]
            assert int(model.encoder.embed.output_lengths(torch.tensor(n))) == len(mask), (kind, n)


def test_a_model_without_dynamic_chunks_refuses_to_stream():
    model = ConformerModel(attrs.evolve(ConformerModelConfig.tiny(), encoder=attrs.evolve(
        ConformerModelConfig.tiny().encoder, use_dynamic_chunk=False)))
    assert model.encoder.streaming_kind == "none" and model.cache_spec is None
    with pytest.raises(CapabilityError, match="use_dynamic_chunk"):
        model.encoder.streaming_geometry(4)


@pytest.mark.parametrize("variant", ["conv2d6-batchnorm-causal", "conv2d8-relu-causal", "conv2d-nomacaron-causal"])
def test_cpu_time_tiled_subsampling_equals_one_pass(variant):
    embed = _model(variant).encoder.embed
    feats, _ = _feats(700, 650)
    with torch.no_grad():
        tiled = embed._convolve(feats.unsqueeze(1))
        whole = embed.conv(feats.unsqueeze(1))
    assert tiled.shape[2] > 64 // 2  # long enough to be cut into several tiles
    assert torch.equal(tiled, whole)
