"""The frontend registry axis: ExtractorSpec, StreamingFraming, FeatureConfig validation and from_spec."""

from __future__ import annotations

import subprocess
import sys

import attrs
import pytest
import torch

from oasr import hookimpl, plugins, serde
from oasr.errors import ConfigError
from oasr.features import (
    BatchedStreamingFeatureExtractor,
    ExtractorSpec,
    FeatureConfig,
    StreamingFraming,
    build_extractor,
    extract_features_batch,
    list_extractors,
    register_extractor,
    unregister_extractor,
)
from oasr.models.specs import FeatureSpec

BUILTIN = {"kaldi_fbank", "kaldi_mfcc", "whisper_logmel", "nemotron_logmel"}


def test_builtins_are_registered_by_core_through_the_hook():
    assert BUILTIN <= set(list_extractors())
    for kind in BUILTIN:
        assert plugins.registry("extractors").get(kind).distribution == "oasr-core"


def test_listing_frontends_imports_no_torch():
    code = ("import sys, oasr.features as f; kinds = f.list_extractors(); "
            "f.FeatureConfig(feature_type='nemotron_logmel'); assert 'torch' not in sys.modules, 'torch'; print(kinds)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "kaldi_fbank" in done.stdout


def test_unknown_feature_type_fails_when_its_extractor_is_built_naming_the_kinds():
    config = FeatureConfig(feature_type="mystery_mel")  # a plain value: no registry is consulted
    with pytest.raises(ConfigError, match="'mystery_mel' is not a registered extractor; registered: ") as err:
        build_extractor(config)
    assert err.value.key == "feature_type"
    # core's kinds in order among whatever the installed families add (oasr-models-hf: lasr_logmel)
    named = str(err.value).split("registered: ", 1)[1].split(", ")
    assert named == sorted(named)
    assert {"kaldi_fbank", "kaldi_mfcc", "nemotron_logmel", "whisper_logmel"} <= set(named)


@pytest.mark.parametrize("kwargs, key", [
    ({"sample_rate": 0}, "sample_rate"),
    ({"num_mel_bins": -3}, "num_mel_bins"),
    ({"frame_shift_ms": 0.01}, "frame_length_ms"),
    ({"lfr_m": 0}, "lfr_m"),
    ({"dither": -1.0}, "dither"),
    ({"preemphasis": 1.5}, "preemphasis"),
    ({"normalize": "global"}, "normalize"),
    ({"normalize": "cmvn"}, "options"),
    ({"options": {"raw_energy": False, "nonsense": 1}}, "options"),
    ({"feature_type": "whisper_logmel", "options": {"raw_energy": False}}, "options"),
    ({"n_fft": 301}, "n_fft"),
    ({"audio_scale": float("nan")}, "audio_scale"),
    ({"window_type": "kaiser"}, "window_type"),
    ({"sample_rate": 8000, "low_freq": 4000.0}, "high_freq"),
    ({"high_freq": -9000.0}, "high_freq"),
    ({"num_mel_bins": 2}, "num_mel_bins"),
    ({"n_fft": 256}, "n_fft"),
    ({"feature_type": "kaldi_mfcc", "num_mel_bins": 23, "num_ceps": 24}, "num_ceps"),
    ({"feature_type": "nemotron_logmel", "n_fft": 256}, "n_fft"),
    ({"feature_type": "nemotron_logmel", "options": {"mel_filters_dtype": "int8"}}, "options"),
])
def test_bad_values_are_refused_naming_the_field(kwargs, key):
    """By the config itself or, for what depends on the frontend, where its extractor is built."""
    with pytest.raises(ConfigError) as err:
        build_extractor(FeatureConfig(**kwargs))
    assert err.value.key == key


def test_from_spec_carries_every_feature_spec_field():
    changed = dict(kind="kaldi_mfcc", sample_rate=8000, num_mel_bins=40, frame_length_ms=20.0, frame_shift_ms=8.0,
                   dither=0.5, window_type="hamming", snip_edges=False, low_freq=50.0, high_freq=-300.0,
                   use_energy=True, num_ceps=20, preemphasis=0.9, lfr_m=3, lfr_n=2, window_seconds=12.0,
                   normalize="cmvn", audio_scale=32768.0,
                   options={"n_fft": 512, "energy_floor": 1.0, "cepstral_lifter": 0.0, "raw_energy": False,
                            "cmvn_mean": [0.0] * 60, "cmvn_istd": [1.0] * 60})
    assert set(changed) == {f.name for f in attrs.fields(FeatureSpec)}, "a FeatureSpec field is not covered"
    spec = FeatureSpec(**changed)
    cfg = FeatureConfig.from_spec(spec)
    assert cfg.feature_type == "kaldi_mfcc"
    for name, value in changed.items():
        if name not in ("kind", "options"):
            assert getattr(cfg, name) == value, name
    assert (cfg.n_fft, cfg.energy_floor, cfg.cepstral_lifter) == (512, 1.0, 0.0)
    assert set(cfg.options) == {"raw_energy", "cmvn_mean", "cmvn_istd"}
    assert cfg.output_dim == 60 and cfg.output_frame_shift == 128
    assert FeatureConfig.from_spec(FeatureSpec(kind="whisper_logmel", window_seconds=30.0)).fixed_window_frames == 3000
    with pytest.raises(ConfigError, match="not a registered extractor"):
        FeatureConfig.from_spec(FeatureSpec(kind="nope")).check_frontend()


def test_the_config_round_trips_through_the_serde_converter():
    cfg = FeatureConfig(feature_type="kaldi_mfcc", num_mel_bins=40, options={"raw_energy": False})
    assert serde.structure(serde.unstructure(cfg), FeatureConfig) == cfg
    with pytest.raises(ConfigError, match="bogus"):
        serde.structure({**serde.unstructure(cfg), "bogus": 1}, FeatureConfig)


def test_geometry_and_declarations():
    paraformer = FeatureConfig(window_type="hamming", lfr_m=7, lfr_n=6, audio_scale=32768.0)
    assert paraformer.output_dim == 560 and paraformer.output_frame_shift == 960
    assert FeatureConfig(use_energy=True).feature_dim == 81
    assert FeatureConfig(feature_type="kaldi_fbank").fixed_window_seconds is None
    assert build_extractor(FeatureConfig()).framing == StreamingFraming(span=400, hop=160)
    assert build_extractor(FeatureConfig(snip_edges=False)).framing == StreamingFraming(span=400, hop=160, mirror=120)
    assert build_extractor(FeatureConfig(feature_type="nemotron_logmel")).framing == StreamingFraming(
        span=512, hop=160, history=1, prefill=257, postfill=96)
    assert not build_extractor(FeatureConfig(feature_type="whisper_logmel")).supports_streaming
    assert hash(FeatureConfig(options={"raw_energy": True})) == hash(FeatureConfig(options={"raw_energy": True}))


def _energy_fn(padded, lengths, config):
    """A toy frontend: log energy of non-overlapping frames, one feature per frame."""
    hop = config.frame_shift
    frames = padded[:, : padded.shape[1] // hop * hop].reshape(padded.shape[0], -1, hop)
    return (frames.square().sum(-1, keepdim=True) + 1e-10).log(), lengths // hop


class _ToyPlugin:
    @hookimpl
    def oasr_register_extractors(self, register):
        register(ExtractorSpec(kind="toy_energy", fn=f"{__name__}:_energy_fn",
                               framing=StreamingFraming(span=160, hop=160), feature_dim=lambda c: 1))


@pytest.fixture
def toy_plugin():
    plugins.register_plugin(_ToyPlugin(), name="toy-frontend", distribution="toy-frontend")
    yield
    plugins.unregister_plugin("toy-frontend")


def test_a_plugin_frontend_needs_no_other_change(toy_plugin):
    assert "toy_energy" in list_extractors()
    assert plugins.registry("extractors").get("toy_energy").distribution == "toy-frontend"
    cfg = FeatureConfig(feature_type="toy_energy", lfr_m=2, lfr_n=2)
    assert cfg.output_dim == 2
    audio = [torch.ones(1600), torch.ones(800)]
    feats, lens = extract_features_batch(audio, cfg)
    assert lens.tolist() == [5, 3] and feats.shape == (2, 5, 2)
    torch.testing.assert_close(feats[0, 0], torch.full((2,), torch.tensor(160.0 + 1e-10).log().item()))
    streaming = BatchedStreamingFeatureExtractor(FeatureConfig(feature_type="toy_energy"), batch_size=1)
    assert streaming.process_chunk(0, torch.ones(500)).shape == (3, 1)


def test_runtime_registration_and_collisions():
    spec = ExtractorSpec(kind="toy_runtime", fn=_energy_fn)
    register_extractor(spec)
    try:
        assert "toy_runtime" in list_extractors()
        assert FeatureConfig(feature_type="toy_runtime").feature_dim == 80  # default: num_mel_bins
        with pytest.raises(ValueError, match="already registered by 'oasr-core'"):
            register_extractor(ExtractorSpec(kind="kaldi_fbank", fn=_energy_fn))
    finally:
        unregister_extractor("toy_runtime")
    assert "toy_runtime" not in list_extractors()
