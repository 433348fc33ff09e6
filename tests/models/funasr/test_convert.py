"""The FunASR converter: detection, ``am.mvn`` as encoder buffers, refusals, the native round trip."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import yaml

import oasr
from oasr.checkpoints.convert import convert
from oasr.errors import CheckpointFormatError, UnsupportedConfigError
from oasr.models.registry import detect_architecture
from oasr_models_funasr.convert import FunASRParaformerConverter, read_am_mvn
from tests.models.funasr import _helpers as h


@pytest.fixture
def copy(model_dirs, tmp_path) -> Path:
    out = tmp_path / "model"
    shutil.copytree(model_dirs[("Paraformer", "small")], out)
    return out


def _edit(path: Path, change) -> None:
    conf = yaml.safe_load((path / "config.yaml").read_text())
    change(conf)
    (path / "config.yaml").write_text(yaml.safe_dump(conf, allow_unicode=True))


@pytest.mark.parametrize("model", ["Paraformer", "BiCifParaformer"])
def test_detected_from_config_yaml(model, model_dirs):
    path = model_dirs[(model, "small")]
    assert detect_architecture(path) == "paraformer"
    loaded = oasr.load_pretrained(path)
    assert loaded.architecture == "paraformer"
    assert loaded.model.config.has_timestamp_head == (model == "BiCifParaformer")
    spec = loaded.feature_spec
    assert (spec.kind, spec.lfr_m, spec.lfr_n, spec.window_type, spec.audio_scale) == \
        ("kaldi_fbank", 7, 6, "hamming", 32768.0)
    assert loaded.tokenizer_spec.kind == "funasr_char"


def test_am_mvn_becomes_encoder_buffers(model_dirs, references):
    path = model_dirs[("Paraformer", "small")]
    shift, scale = read_am_mvn(path / "am.mvn")
    cmvn = references[("Paraformer", "small")].kwargs["frontend"].cmvn  # FunASR's own parse
    assert torch.equal(shift, cmvn[0]) and torch.equal(scale, cmvn[1])
    model = oasr.load_pretrained(path).model
    assert torch.equal(model.encoder.cmvn_shift, shift) and torch.equal(model.encoder.cmvn_scale, scale)


def test_unknown_architecture_value_is_not_claimed(copy):
    _edit(copy, lambda c: c.update(model="SomethingElse"))
    assert not FunASRParaformerConverter().detect(copy)


@pytest.mark.parametrize(("change", "key"), [
    (lambda c: c.update(encoder="ConformerEncoder"), "encoder"),
    (lambda c: c["encoder_conf"].update(input_layer="conv2d"), "encoder_conf.input_layer"),
    (lambda c: c["encoder_conf"].update(mystery_knob=3), "encoder_conf.mystery_knob"),
    (lambda c: c.update(predictor="CifPredictorV3"), "predictor"),
])
def test_unsupported_config_is_refused_naming_the_key(copy, change, key):
    _edit(copy, change)
    with pytest.raises(UnsupportedConfigError, match=key.replace(".", r"\.")):
        oasr.load_pretrained(copy)


def test_broken_am_mvn_is_a_clear_error(copy):
    (copy / "am.mvn").write_text("<Nnet>\n</Nnet>\n")
    with pytest.raises(CheckpointFormatError, match="am.mvn"):
        oasr.load_pretrained(copy)


@pytest.mark.parametrize("model", ["Paraformer", "BiCifParaformer"])
def test_native_bundle_round_trip_is_bit_identical(model, model_dirs, clips, tmp_path):
    loaded = oasr.load_pretrained(model_dirs[(model, "deep")])
    bundle = convert(str(model_dirs[(model, "deep")]), tmp_path / "bundle")
    again = oasr.load_pretrained(bundle)
    assert again.architecture == "paraformer" and again.config == loaded.config
    assert (again.feature_spec, again.decoding_defaults) == (loaded.feature_spec, loaded.decoding_defaults)
    for key, value in loaded.model.state_dict().items():
        assert torch.equal(value, again.model.state_dict()[key]), key
    waves = [audio for _, audio in clips[:3]]
    first = oasr.Engine(oasr.EngineConfig(model=str(model_dirs[(model, "deep")])), loaded=loaded)
    second = oasr.Engine(oasr.EngineConfig(model=str(bundle)), loaded=again)
    feats, lens = oasr.features.extract_features_batch([torch.from_numpy(w) for w in waves], first.feature_config)
    with torch.inference_mode():
        a, b = first.model.recognize(feats, lens), second.model.recognize(feats, lens)
    assert torch.equal(a.log_probs, b.log_probs) and torch.equal(a.alphas, b.alphas)
    assert [o.text for o in first.transcribe_outputs(waves)] == [o.text for o in second.transcribe_outputs(waves)]


def test_features_match_funasr_frontend(model_dirs, references, clips):
    """OASR's kaldi_fbank + LFR equals FunASR's WavFrontend (before CMVN) to float32 log-mel noise."""
    engine = oasr.Engine(oasr.EngineConfig(model=str(model_dirs[("Paraformer", "small")])))
    waves = [audio for _, audio in clips]
    ours, lens = oasr.features.extract_features_batch([torch.from_numpy(w) for w in waves], engine.feature_config)
    for row, audio in enumerate(waves):
        ref = h.reference_pass(references[("Paraformer", "small")], [audio])
        assert int(lens[row]) == int(ref.feat_lens[0])
        n = int(lens[row])
        assert float((ours[row, :n] - ref.raw_feats[0, :n]).abs().max()) < 5e-3
