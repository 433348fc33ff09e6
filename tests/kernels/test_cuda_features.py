"""``stft_mel@cuda`` under the numba CUDA simulator against the CPU feature chain it replaces.

Shapes are small (a 1.6 kHz "Kaldi" config: 40-sample windows) because each simulated GPU thread is a
Python thread.  Every recipe is run end to end through its public entry point with the kernel swapped
in for ``oasr.features.spectral.stft_mel``, so framing, dither, DC removal, pre-emphasis, window, sparse
mel projection, each log mode, energy and the MFCC DCT are all compared with the CPU path.
"""

from __future__ import annotations

import math

import pytest
import torch

import oasr.features.nemotron as nemotron_mod
import oasr.features.spectral as feature_mod
import oasr.features.whisper as whisper_mod
from oasr.features.spectral import Fbank, Mfcc
from oasr_kernels.cuda import features as cuda_features


def signal(batch: int, samples: int, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(samples, dtype=torch.float32)
    chirp = torch.sin(2 * math.pi * (0.01 + 0.0004 * t) * t)
    return scale * (chirp[None, :] * torch.rand(batch, 1, generator=g) + 0.1 * torch.randn(batch, samples, generator=g))


def swap_kernel(monkeypatch) -> None:
    for module in (feature_mod, whisper_mod, nemotron_mod):
        monkeypatch.setattr(module, "stft_mel", cuda_features.stft_mel)


def assert_features_close(got: torch.Tensor, want: torch.Tensor, *, atol: float = 2e-4) -> None:
    assert got.shape == want.shape
    assert torch.isfinite(got).all()
    diff = (got - want).abs().max().item()
    assert diff <= atol, f"max |cuda - cpu| = {diff}"


KALDI = dict(sample_rate=1600, num_mel_bins=10, low_freq=20.0, high_freq=0.0)


@pytest.mark.parametrize("options", [
    dict(),  # povey, DC removal, pre-emphasis 0.97
    dict(window_type="hamming", preemphasis=0.0, remove_dc_offset=False),
    dict(window_type="rectangular", use_energy=True, energy_floor=1.0),
    dict(window_type="blackman", use_energy=True, raw_energy=False, snip_edges=False),
])
def test_kaldi_fbank_matches_cpu(monkeypatch, options):
    wave = signal(2, 200, scale=32768.0)
    lengths = torch.tensor([200, 131])
    module = Fbank(**KALDI, **options)
    want, want_n = module(wave, lengths)
    swap_kernel(monkeypatch)
    got, got_n = module(wave, lengths)
    assert torch.equal(got_n, want_n)
    assert_features_close(got, want, atol=2e-3)
    assert got[1, int(got_n[1]):].abs().max() == 0  # frames past a row's count stay zero


def test_kaldi_fbank_with_dither_draws_the_same_noise(monkeypatch):
    wave = signal(2, 160, seed=3)
    module = Fbank(**KALDI, dither=1.0)
    torch.manual_seed(7)
    want, _ = module(wave)
    swap_kernel(monkeypatch)
    torch.manual_seed(7)
    got, _ = module(wave)
    assert_features_close(got, want, atol=1e-3)
    torch.manual_seed(8)
    other, _ = module(wave)
    assert (other - want).abs().max() > 1e-2  # the noise is really added


@pytest.mark.parametrize("use_energy", [False, True])
def test_kaldi_mfcc_matches_cpu(monkeypatch, use_energy):
    wave = signal(2, 180, seed=1, scale=32768.0)
    module = Mfcc(**dict(KALDI, num_mel_bins=12), num_ceps=6, use_energy=use_energy)
    want, _ = module(wave, torch.tensor([180, 100]))
    swap_kernel(monkeypatch)
    got, _ = module(wave, torch.tensor([180, 100]))
    assert_features_close(got, want, atol=2e-3)


def test_whisper_logmel_matches_cpu(monkeypatch):
    wave = signal(2, 320, seed=2)
    lengths = torch.tensor([320, 250])
    kwargs = dict(num_mels=8, n_fft=32, hop=16, sample_rate=1600)
    want, want_n = whisper_mod.whisper_logmel(wave, lengths, **kwargs)
    swap_kernel(monkeypatch)
    got, got_n = whisper_mod.whisper_logmel(wave, lengths, **kwargs)
    assert torch.equal(got_n, want_n)
    assert_features_close(got, want, atol=1e-4)


def test_nemotron_logmel_matches_cpu(monkeypatch):
    from oasr.features import FeatureConfig

    config = FeatureConfig(feature_type="nemotron_logmel", sample_rate=1600, num_mel_bins=8, n_fft=64,
                           frame_length_ms=25.0, frame_shift_ms=10.0, preemphasis=0.97)
    wave = signal(2, 300, seed=4)
    lengths = torch.tensor([300, 222])
    want, want_n = nemotron_mod.batched_nemotron_logmel(wave, lengths, config)
    swap_kernel(monkeypatch)
    got, got_n = nemotron_mod.batched_nemotron_logmel(wave, lengths, config)
    assert torch.equal(got_n, want_n)
    assert_features_close(got, want, atol=1e-4)


def test_sparse_filters_cover_every_nonzero_weight():
    banks = feature_mod.kaldi_mel_banks(10, 64, 1600, 20.0, 0.0)
    weight = feature_mod.interleave_power_weight(banks)
    filters, lo, hi = cuda_features.sparse_filters(weight, 10)
    assert torch.equal(filters, banks)
    for m in range(10):
        nz = banks[m].nonzero().flatten()
        assert (int(lo[m]), int(hi[m])) == (int(nz[0]), int(nz[-1]) + 1)


def test_the_kernel_refuses_a_tensor_it_cannot_read():
    with pytest.raises(ValueError, match="too short"):
        cuda_features.stft_mel(torch.zeros(1, 10), [3], torch.zeros(1, 3, 4), span=8, hop=4, n_fft=8,
                               window=torch.ones(8), mel_weight=torch.zeros(10, 16), num_mels=4)
