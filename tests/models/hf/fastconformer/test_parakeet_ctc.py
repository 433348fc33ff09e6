"""Parakeet CTC (``parakeet_ctc``) against transformers' ``ParakeetForCTC`` + ``ParakeetProcessor`` on tiny random
checkpoints (two shapes, built by transformers) and espeak-ng speech: frontend, encoder, CTC ids and text,
batching, word timings, the native bundle, and the FastConformer choices each pinned in float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from oasr.checkpoints.loading import load_pretrained
from oasr.engine import Engine, EngineConfig
from oasr.engine.options import DecodingOptions
from oasr.features import FeatureConfig, extract_features_batch

pytestmark = pytest.mark.reference

#: logit gap below which two implementations' float32 noise could swap a frame's argmax
MARGIN = 1e-4


def _features(loaded, audios):
    return extract_features_batch([torch.from_numpy(a) for a in audios], FeatureConfig.from_spec(loaded.feature_spec))


def _reference(hf, processor, audios):
    """transformers' greedy CTC per clip alone: frame ids (``generate``), logits and the processor's text."""
    out = []
    for audio in audios:
        inputs = processor(audio, sampling_rate=16000, return_tensors="pt")
        with torch.no_grad():
            logits = hf(**inputs).logits[0]
            ids = hf.generate(**inputs)[0]
        out.append((ids, logits, processor.batch_decode(ids[None], skip_special_tokens=True)[0]))
    return out


def _collapse(ids, blank: int) -> list[int]:
    out, prev = [], None
    for i in ids:
        if i != prev and i != blank:
            out.append(int(i))
        prev = i
    return out


def _margins(logits: torch.Tensor) -> torch.Tensor:
    top = logits.topk(2, dim=-1).values
    return top[..., 0] - top[..., 1]


# -- loading and frontend ----------------------------------------------------------------------------------------
def test_loads_by_detection_with_nothing_left_over(ours_ctc, hf_ctc):
    hf, _ = hf_ctc
    assert ours_ctc.architecture == "parakeet_ctc"
    assert ours_ctc.load_report.missing == []
    assert all(k.endswith("num_batches_tracked") for k in ours_ctc.load_report.dropped)
    assert ours_ctc.config.blank_id == hf.config.pad_token_id == hf.config.vocab_size - 1
    assert ours_ctc.decoding_defaults.decode_type == "ctc"
    assert ours_ctc.decoding_defaults.blank_id == hf.config.pad_token_id
    assert ours_ctc.feature_spec.kind == "nemotron_logmel" and ours_ctc.feature_spec.normalize == "per_feature"


def test_frontend_equals_parakeet_feature_extractor(ours_ctc, hf_ctc, speech):
    _, processor = hf_ctc
    ref = processor.feature_extractor(speech, sampling_rate=16000, return_tensors="pt")
    feats, lengths = _features(ours_ctc, speech)
    assert lengths.tolist() == ref.attention_mask.sum(-1).tolist()
    width = feats.shape[1]
    torch.testing.assert_close(feats, ref.input_features[:, :width], rtol=0, atol=5e-5)


# -- encoder and CTC -------------------------------------------------------------------------------------------
def test_encoder_within_1e4_relative_batched_and_alone(ours_ctc, hf_ctc, speech):
    hf, processor = hf_ctc
    inputs = processor(speech, sampling_rate=16000, return_tensors="pt")
    with torch.no_grad():
        ref = hf.encoder(input_features=inputs.input_features, attention_mask=inputs.attention_mask).last_hidden_state
        hidden, lengths = ours_ctc.model.encode_offline(inputs.input_features, inputs.attention_mask.sum(-1))
        expected = hf._get_subsampling_output_length(inputs.attention_mask.sum(-1))
        assert lengths.tolist() == expected.tolist()
        for b, n in enumerate(lengths.tolist()):
            err = (hidden[b, :n] - ref[b, :n]).abs().max() / ref[b, :n].abs().max()
            assert err < 1e-4, f"row {b} batched: relative error {err:.2e}"
            alone = processor(speech[b], sampling_rate=16000, return_tensors="pt")
            ref_alone = hf.encoder(**alone).last_hidden_state[0]
            mine, _ = ours_ctc.model.encode_offline(alone.input_features, alone.attention_mask.sum(-1))
            err = (mine[0, :n] - ref_alone[:n]).abs().max() / ref_alone[:n].abs().max()
            assert err < 1e-4, f"row {b} alone: relative error {err:.2e}"


def test_ctc_ids_and_text_equal_generate(ours_ctc, hf_ctc, speech):
    hf, processor = hf_ctc
    blank = hf.config.pad_token_id
    outputs = Engine(EngineConfig(max_batch_size=1), loaded=ours_ctc).transcribe_outputs(list(speech))
    compared = total = clips = 0
    for (ids, logits, text), out, audio in zip(_reference(hf, processor, speech), outputs, speech, strict=True):
        feats, lengths = _features(ours_ctc, [audio])
        with torch.no_grad():
            mine = ours_ctc.model.forward_offline(feats, lengths)[0][0].argmax(-1)
        # the processor's frame past the last full hop is masked: generate() makes it a blank
        assert mine.shape[0] <= ids.shape[0] <= mine.shape[0] + 1 and bool((ids[mine.shape[0]:] == blank).all())
        ids, logits = ids[: mine.shape[0]], logits[: mine.shape[0]]
        safe = _margins(logits) > MARGIN
        assert torch.equal(mine[safe], ids[safe]), "a frame clear of near-ties has another argmax"
        total += safe.numel()
        compared += int(safe.sum())
        reference = _collapse(ids.tolist(), blank)
        assert len(set(reference)) > 3, "the random model emits too few distinct tokens to test anything"
        if bool(safe.all()):  # the whole path is clear of float noise: ids and text must be equal
            assert out.tokens == reference
            assert out.text == text
            clips += 1
    assert compared >= 0.99 * total and clips >= len(speech) - 1


def test_batched_equals_one_at_a_time(ours_ctc, speech):
    alone = Engine(EngineConfig(max_batch_size=1), loaded=ours_ctc).transcribe_outputs(list(speech))
    batched = Engine(EngineConfig(max_batch_size=8, max_pad_ratio=10.0), loaded=ours_ctc).transcribe_outputs(
        list(speech))
    assert any(a.tokens for a in alone)
    for a, b in zip(alone, batched, strict=True):
        assert a.tokens == b.tokens and a.text == b.text


def test_word_timings_and_confidences_from_the_ctc_alignment(ours_ctc, speech):
    out = Engine(EngineConfig(), loaded=ours_ctc).transcribe_outputs(
        speech[3], decoding=DecodingOptions(word_timestamps=True))
    assert out.words and [w.word for w in out.words] == out.text.split()
    duration = len(speech[3]) / 16000
    starts = [w.start for w in out.words]
    assert starts == sorted(starts) and all(0 <= w.start < w.end <= duration + 0.1 for w in out.words)
    assert all(0.0 < w.confidence <= 1.0 for w in out.words)


def test_native_bundle_round_trip_is_bit_identical(ours_ctc, speech, tmp_path):
    from oasr.checkpoints.native import load_native, save_native

    save_native(ours_ctc, tmp_path / "bundle")
    again = load_native(tmp_path / "bundle")
    assert again.config == ours_ctc.config and again.feature_spec == ours_ctc.feature_spec
    feats, lengths = _features(again, speech)
    with torch.no_grad():
        a, _ = ours_ctc.model.forward_offline(feats, lengths)
        b, _ = again.model.forward_offline(feats, lengths)
    assert torch.equal(a, b)


def test_short_audio_decodes_without_error(ours_ctc):
    engine = Engine(EngineConfig(), loaded=ours_ctc)
    for samples in (100, 1000):
        out = engine.transcribe_outputs(np.zeros(samples, dtype=np.float32))
        assert out.error is None and out.finish_reason == "stop"


def test_a_feature_size_other_than_the_encoders_is_refused(ctc_dir, tmp_path):
    import json
    import shutil

    from oasr.errors import CheckpointFormatError

    copy = shutil.copytree(ctc_dir, tmp_path / "bad")
    processor = json.loads((copy / "processor_config.json").read_text())
    processor["feature_extractor"]["feature_size"] += 1
    (copy / "processor_config.json").write_text(json.dumps(processor))
    with pytest.raises(CheckpointFormatError, match="feature_size"):
        load_pretrained(copy)


# -- each FastConformer choice pinned: in float64 the reference is matched to 1e-9 and each textbook alternative
# misses it by 100x that or more ----------------------------------------------------------------------------------
def _float64_pair(ctc_dir, speech):
    from transformers import ParakeetForCTC

    hf = ParakeetForCTC.from_pretrained(ctc_dir).double().eval()
    loaded = load_pretrained(ctc_dir, dtype="float64")
    feats, lengths = _features(loaded, speech[:2])
    mask = torch.arange(feats.shape[1])[None, :] < lengths[:, None]
    with torch.no_grad():
        ref = hf(input_features=feats.double(), attention_mask=mask.long()).logits
    return loaded.model, feats.double(), lengths, ref


def _error(model, feats, lengths, ref) -> float:
    with torch.no_grad():
        hidden, out_lens = model.encode_offline(feats, lengths)
        logits = model.logits(hidden)
    return max(float((logits[b, :n] - ref[b, :n]).abs().max()) for b, n in enumerate(out_lens.tolist()))


def test_relative_position_choices_are_load_bearing(ctc_dir, speech, monkeypatch):
    from oasr_models_hf.fastconformer import encoder as enc

    model, feats, lengths, ref = _float64_pair(ctc_dir, speech)
    assert _error(model, feats, lengths, ref) < 1e-9
    true_index = enc.rel_shift_index
    monkeypatch.setattr(enc, "rel_shift_index", lambda t, device: true_index(t, device).flip(-1))  # j - i
    assert _error(model, feats, lengths, ref) > 1e-7
    monkeypatch.setattr(enc, "rel_shift_index", true_index)
    true_table = enc.relative_positions

    def cos_first(frames, dim, device, dtype):  # [cos, sin] instead of [sin, cos] per frequency
        table = true_table(frames, dim, device, dtype)
        return table.view(table.shape[0], -1, 2).flip(-1).reshape(table.shape)

    monkeypatch.setattr(enc, "relative_positions", cos_first)
    assert _error(model, feats, lengths, ref) > 1e-7
    monkeypatch.setattr(enc, "relative_positions", true_table)
    for layer in model.encoder.layers:
        layer.self_attn.bias_v.data.zero_()
    assert _error(model, feats, lengths, ref) > 1e-7


def test_input_scale_and_ctc_bias_are_load_bearing(ctc_dir, speech):
    model, feats, lengths, ref = _float64_pair(ctc_dir, speech)
    assert _error(model, feats, lengths, ref) < 1e-9
    scale = model.encoder.input_scale
    model.encoder.input_scale = 1.0 if scale != 1.0 else model.config.hidden_size ** 0.5
    assert _error(model, feats, lengths, ref) > 1e-7
    model.encoder.input_scale = scale
    model.ctc_head.bias.data.zero_()
    assert _error(model, feats, lengths, ref) > 1e-7


def test_padded_frames_are_zeroed_in_the_subsampling_and_before_the_depthwise_conv(ours_ctc, speech, monkeypatch):
    from oasr_models_hf.fastconformer import encoder as enc

    feats, lengths = _features(ours_ctc, speech[:3])
    feats = feats + (torch.arange(feats.shape[1])[None, :, None] >= lengths[:, None, None]) * 3.0  # junk padding

    def gap() -> float:
        with torch.no_grad():
            batched, out_lens = ours_ctc.model.encode_offline(feats, lengths)
            worst = 0.0
            for b, n in enumerate(out_lens.tolist()):
                alone, _ = ours_ctc.model.encode_offline(feats[b:b + 1, : int(lengths[b])], lengths[b:b + 1])
                worst = max(worst, float((batched[b, :n] - alone[0]).abs().max() / alone.abs().max()))
        return worst

    # float32 summation-order noise only: a batch's GEMMs take the packed oneDNN kernel, a short row alone may take
    # MKL's (fewer rows than oasr.layers.packed.MIN_ROWS); the encoder tolerance is 1e-4
    assert gap() < 1e-4
    monkeypatch.setattr(enc, "zero_beyond", lambda x, lengths, axis: x)
    assert gap() > 1e-3
