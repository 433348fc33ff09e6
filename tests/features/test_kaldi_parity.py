"""kaldi_fbank / kaldi_mfcc against torchaudio.compliance.kaldi (the Kaldi reference) over a grid of every
option, the WeNet and icefall fixtures, the FLT_EPSILON mel floor, and the one-implementation property.

Float32 Kaldi implementations agree to rounding only relative to a frame's total energy: a mel bin
that holds 1e-9 of the frame's energy is rounding noise in every implementation (torchaudio and
kaldi-native-fbank differ there too).  ``assert_log_mel_close`` therefore allows a log-domain error of
``atol + rel * frame_energy / bin_energy`` and also requires the typical bin to agree to ~1e-5.
"""

from __future__ import annotations

import math

import pytest
import soundfile as sf
import torch
import torchaudio.compliance.kaldi as ta_kaldi
from safetensors.torch import load_file

from oasr.features import FeatureConfig, extract_features_batch
from oasr.features.batched import build_kaldi_module, kaldi_module
from oasr.features.spectral import FLT_EPSILON, Fbank, Mfcc

LOG_EPS = math.log(FLT_EPSILON)


def assert_log_mel_close(ours: torch.Tensor, ref: torch.Tensor, *, rel: float = 5e-5, atol: float = 2e-4) -> None:
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    ours64, ref64 = ours.double(), ref.double()
    lin = ref64.exp()
    tol = atol + rel * lin.sum(-1, keepdim=True) / lin
    diff = (ours64 - ref64).abs()
    worst = (diff - tol).argmax()
    assert (diff <= tol).all(), (f"max excess at flat index {int(worst)}: ours {ours64.flatten()[worst]:.6f} "
                                 f"ref {ref64.flatten()[worst]:.6f} tol {tol.flatten()[worst]:.2e}")
    assert diff.median() < 1e-5


def _ta_kwargs(cfg: FeatureConfig) -> dict:
    kw = dict(sample_frequency=cfg.sample_rate, num_mel_bins=cfg.num_mel_bins, frame_length=cfg.frame_length_ms,
              frame_shift=cfg.frame_shift_ms, dither=cfg.dither, window_type=cfg.window_type,
              snip_edges=cfg.snip_edges, low_freq=cfg.low_freq, high_freq=cfg.high_freq, use_energy=cfg.use_energy,
              energy_floor=cfg.energy_floor, preemphasis_coefficient=cfg.effective_preemphasis,
              raw_energy=cfg.options.get("raw_energy", True), remove_dc_offset=cfg.options.get("remove_dc_offset", True),
              blackman_coeff=cfg.options.get("blackman_coeff", 0.42))
    if cfg.n_fft is not None:
        assert cfg.n_fft == cfg.frame_length, "torchaudio can only express n_fft == window length"
        kw["round_to_power_of_two"] = False
    if cfg.feature_type == "kaldi_mfcc":
        kw.update(num_ceps=cfg.num_ceps, cepstral_lifter=cfg.cepstral_lifter)
    return kw


def _rows(signal, rate: int) -> list[torch.Tensor]:
    return [signal(int(rate * s), rate, seed=i) for i, s in enumerate((1.0, 0.4861, 0.1, 1.5625))]


FBANK_GRID = [
    {},
    {"window_type": "hanning"},
    {"window_type": "hamming", "num_mel_bins": 40},
    {"window_type": "blackman", "options": {"blackman_coeff": 0.40}},
    {"window_type": "rectangular", "preemphasis": 0.0},
    {"snip_edges": False},
    {"snip_edges": False, "window_type": "hamming", "low_freq": 0.0, "high_freq": -400.0},
    {"use_energy": True},
    {"use_energy": True, "energy_floor": 1.0, "options": {"raw_energy": False}},
    {"use_energy": True, "snip_edges": False, "energy_floor": 0.1, "window_type": "hanning"},
    {"low_freq": 64.0, "high_freq": 7000.0, "num_mel_bins": 23},
    {"sample_rate": 8000, "num_mel_bins": 23, "high_freq": -200.0},
    {"sample_rate": 22050, "num_mel_bins": 64},
    {"frame_length_ms": 20.0, "frame_shift_ms": 5.0},
    {"n_fft": 400},
    {"options": {"remove_dc_offset": False}, "preemphasis": 0.5},
]


@pytest.mark.reference
@pytest.mark.parametrize("audio_scale", [1.0, 32768.0])
@pytest.mark.parametrize("overrides", FBANK_GRID, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "defaults")
def test_fbank_matches_torchaudio(signal, overrides, audio_scale):
    cfg = FeatureConfig(feature_type="kaldi_fbank", audio_scale=audio_scale, **overrides)
    rows = _rows(signal, cfg.sample_rate)
    feats, lens = extract_features_batch(rows, cfg)
    for i, row in enumerate(rows):
        ref = ta_kaldi.fbank(row[None] * audio_scale, **_ta_kwargs(cfg))
        assert int(lens[i]) == ref.shape[0]
        ours = feats[i, :ref.shape[0]]
        if cfg.use_energy:
            torch.testing.assert_close(ours[:, 0], ref[:, 0], rtol=0, atol=1e-4)
            ours, ref = ours[:, 1:], ref[:, 1:]
        assert_log_mel_close(ours, ref)
        assert not feats[i, int(lens[i]):].any(), "frames past a row's count must be zero"


MFCC_GRID = [
    {"num_mel_bins": 23},
    {"num_mel_bins": 40, "num_ceps": 20, "cepstral_lifter": 0.0},
    {"num_mel_bins": 23, "use_energy": True, "window_type": "hamming"},
    {"num_mel_bins": 80, "snip_edges": False, "low_freq": 0.0, "high_freq": -400.0},
    {"num_mel_bins": 23, "sample_rate": 8000, "window_type": "blackman"},
]


@pytest.mark.reference
@pytest.mark.parametrize("audio_scale", [1.0, 32768.0])
@pytest.mark.parametrize("overrides", MFCC_GRID, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_mfcc_matches_torchaudio(signal, overrides, audio_scale):
    cfg = FeatureConfig(feature_type="kaldi_mfcc", audio_scale=audio_scale, **overrides)
    rows = _rows(signal, cfg.sample_rate)
    feats, lens = extract_features_batch(rows, cfg)
    assert feats.shape[-1] == cfg.output_dim == cfg.num_ceps
    fbank_kw = {k: v for k, v in _ta_kwargs(cfg).items() if k not in ("num_ceps", "cepstral_lifter")}
    for i, row in enumerate(rows):
        ref = ta_kaldi.mfcc(row[None] * audio_scale, **_ta_kwargs(cfg))
        ours = feats[i, :int(lens[i])]
        assert ours.shape == ref.shape
        # the log-mel tolerance of assert_log_mel_close, carried through the DCT and lifter
        log_mel = ta_kaldi.fbank(row[None] * audio_scale, **fbank_kw).double()
        if cfg.use_energy:
            log_mel = log_mel[:, 1:]
        lin = log_mel.exp()
        bin_tol = 2e-4 + 5e-5 * lin.sum(-1, keepdim=True) / lin
        gain = math.sqrt(2.0 / cfg.num_mel_bins) * (1.0 + 0.5 * cfg.cepstral_lifter)
        tol = 1e-4 + gain * bin_tol.sum(-1, keepdim=True)
        diff = (ours.double() - ref.double()).abs()
        if cfg.use_energy:
            torch.testing.assert_close(ours[:, 0], ref[:, 0], rtol=0, atol=1e-4)
            diff = diff[:, 1:]
        assert (diff <= tol).all(), float((diff - tol).max())
        assert diff.median() < 5e-4


@pytest.mark.reference
def test_dither_draws_what_torchaudio_draws(signal):
    cfg = FeatureConfig(dither=1.0, audio_scale=32768.0)
    rows = _rows(signal, 16000)
    torch.manual_seed(1234)
    feats, lens = extract_features_batch(rows, cfg)
    torch.manual_seed(1234)
    refs = [ta_kaldi.fbank(row[None] * 32768.0, **_ta_kwargs(cfg)) for row in rows]
    undithered, _ = extract_features_batch(rows, FeatureConfig(audio_scale=32768.0))
    for i, ref in enumerate(refs):
        assert_log_mel_close(feats[i, :int(lens[i])], ref)
    assert not torch.equal(feats, undithered)


class TestKaldiMelFloor:
    """The mel floor is FLT_EPSILON (log = -15.94), not float32 tiny (-87.3), at either audio scale."""

    @pytest.mark.parametrize("audio_scale", [1.0, 32768.0])
    def test_digital_silence_is_floored_at_flt_epsilon(self, audio_scale):
        silence = torch.zeros(1, 8000)
        ours, _ = extract_features_batch(silence, FeatureConfig(audio_scale=audio_scale))
        ref = ta_kaldi.fbank(silence * audio_scale, num_mel_bins=80, energy_floor=0.0)
        assert torch.equal(ours[0], ref)
        assert torch.all(ours == torch.tensor(LOG_EPS, dtype=torch.float32))

    def test_quiet_speech_at_unit_scale_reaches_the_floor(self, signal):
        quiet = signal(16000, seed=3) * 2e-5
        ours, _ = extract_features_batch([quiet], FeatureConfig(audio_scale=1.0))
        ref = ta_kaldi.fbank(quiet[None], num_mel_bins=80, energy_floor=0.0)
        floored_ref = ref == torch.tensor(LOG_EPS)
        assert floored_ref.sum() > 100, "the test signal must reach the floor"
        assert float(ours.min()) == pytest.approx(LOG_EPS, abs=1e-6)
        assert ((ours[0] == torch.tensor(LOG_EPS)) == floored_ref).float().mean() > 0.99
        assert_log_mel_close(ours[0], ref)


def test_the_engine_path_and_the_waist_module_are_one_implementation(signal):
    rows = _rows(signal, 16000)
    for cfg, layer in [
        (FeatureConfig(audio_scale=32768.0, window_type="hamming", use_energy=True),
         Fbank(num_mel_bins=80, window_type="hamming", use_energy=True)),
        (FeatureConfig(feature_type="kaldi_mfcc", num_mel_bins=40, num_ceps=13, audio_scale=32768.0, snip_edges=False),
         Mfcc(num_mel_bins=40, num_ceps=13, snip_edges=False)),
    ]:
        engine, engine_lens = extract_features_batch(rows, cfg)
        padded = torch.zeros(len(rows), max(r.numel() for r in rows))
        for i, r in enumerate(rows):
            padded[i, :r.numel()] = r
        lengths = torch.tensor([r.numel() for r in rows])
        direct, direct_lens = layer(padded * 32768.0, lengths)
        assert torch.equal(engine, direct) and torch.equal(engine_lens, direct_lens)
        assert type(kaldi_module(cfg)) is type(layer) is type(build_kaldi_module(cfg))


def test_a_row_is_computed_the_same_alone_and_in_any_batch(signal):
    sizes = (3000, 16000, 401, 7000, 48000, 0, 399)
    rows = [signal(n, seed=n) for n in sizes]
    cfg = FeatureConfig(audio_scale=32768.0)
    batch, lens = extract_features_batch(rows, cfg)
    assert lens.tolist() == [1 + (n - 400) // 160 if n >= 400 else 0 for n in sizes]
    for i, row in enumerate(rows):
        alone, alone_lens = extract_features_batch(row[None], cfg)
        assert int(alone_lens[0]) == int(lens[i])
        assert torch.equal(alone[0], batch[i, :alone.shape[1]])
        assert not batch[i, int(lens[i]):].any()


@pytest.mark.reference
@pytest.mark.parametrize("clip", ["clip0", "clip1"])
def test_fixture_features_of_wenet_and_icefall(fixtures_dir, clip):
    samples, rate = sf.read(fixtures_dir / "audio" / f"{clip}.wav", dtype="int16")
    assert rate == 16000
    audio = torch.from_numpy(samples).float() / 32768
    wenet = load_file(fixtures_dir / "wenet_u2pp" / "ref" / f"{clip}.safetensors")
    ours, _ = extract_features_batch([audio], FeatureConfig(audio_scale=32768.0))
    assert_log_mel_close(ours[0], wenet["fbank"])
    icefall = load_file(fixtures_dir / "zipformer_ctc" / "ref" / f"{clip}.safetensors")
    lhotse_cfg = FeatureConfig(snip_edges=False, high_freq=-400.0, audio_scale=1.0)
    ours, _ = extract_features_batch([audio], lhotse_cfg)
    assert_log_mel_close(ours[0], icefall["fbank_torchaudio"])
    assert_log_mel_close(ours[0], icefall["fbank"])
