"""``lasr_logmel``: the LASR (MedASR) log-mel frontend, batched.

Recipe (transformers' ``LasrFeatureExtractor``), computed in float64 and returned as float32:

- frames of ``win_length`` samples (``frame_length_ms``, 400) every ``hop`` (``frame_shift_ms``, 160),
  not centered and with no edge padding: a row of ``n`` samples has ``(n - win) // hop + 1`` frames;
- a symmetric Hann window (``periodic=False``) over the frame, the frame zero-padded to ``n_fft``
  (512) before the real FFT, the power spectrum;
- HTK-style triangular mel filters on the Kaldi mel scale (``1127 ln(1 + f / 700)``) between
  ``low_freq`` (125 Hz) and ``high_freq`` (7 500 Hz), the DC bin excluded;
- ``ln(max(mel, 1e-5))``; no pre-emphasis, no dither, no normalization; ``audio_scale`` 1.0.

Frames past a row's count are zeros.  Offline only, like the LASR encoder it feeds.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from oasr.errors import ConfigError
from oasr.features.config import FeatureConfig

WINDOW = "hann_symmetric"
LOG_FLOOR = 1e-5
N_FFT = 512


def _kaldi_mel(hz):
    return 1127.0 * np.log(1.0 + np.asarray(hz, dtype=np.float64) / 700.0)


@functools.lru_cache(maxsize=8)
def mel_filters(num_mels: int, n_fft: int, sample_rate: int, low_hz: float, high_hz: float) -> torch.Tensor:
    """(n_fft // 2 + 1, num_mels) float64 filterbank; row 0 (DC) is zero."""
    bins = n_fft // 2 + 1
    freqs = np.linspace(0.0, sample_rate / 2.0, bins, dtype=np.float64)[1:]
    mel = _kaldi_mel(freqs)[:, None]
    edges = np.linspace(_kaldi_mel(low_hz), _kaldi_mel(high_hz), num_mels + 2, dtype=np.float64)
    left, center, right = edges[None, :-2], edges[None, 1:-1], edges[None, 2:]
    rising = (mel - left) / (center - left)
    falling = (right - mel) / (right - center)
    weights = np.maximum(0.0, np.minimum(rising, falling))
    return torch.from_numpy(np.concatenate([np.zeros((1, num_mels)), weights], axis=0))


@functools.lru_cache(maxsize=8)
def _window(length: int) -> torch.Tensor:
    return torch.hann_window(length, periodic=False, dtype=torch.float64)


def lasr_logmel(padded: torch.Tensor, lengths: torch.Tensor, *, num_mels: int = 128, win_length: int = 400,
                hop: int = 160, n_fft: int = N_FFT, sample_rate: int = 16000, low_hz: float = 125.0,
                high_hz: float = 7500.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) samples, (B,) lengths → ((B, T', num_mels) float32 log-mel, (B,) frame counts)."""
    lengths = torch.as_tensor(lengths, dtype=torch.long).reshape(-1).cpu()
    counts = torch.where(lengths >= win_length, (lengths - win_length) // hop + 1, torch.zeros_like(lengths))
    longest = int(counts.max()) if counts.numel() else 0
    device = padded.device
    out = torch.zeros(padded.shape[0], longest, num_mels, device=device)
    if longest == 0:
        return out, counts
    signal = padded[:, : (longest - 1) * hop + win_length].to(torch.float64)
    frames = signal.unfold(-1, win_length, hop) * _window(win_length).to(device)
    power = torch.fft.rfft(frames, n=n_fft).abs().square()
    filters = mel_filters(num_mels, n_fft, sample_rate, float(low_hz), float(high_hz)).to(device)
    out[:] = torch.log(torch.clamp(power @ filters, min=LOG_FLOOR)).float()
    valid = (torch.arange(longest)[None, :] < counts[:, None]).to(device)
    return out.masked_fill_(~valid[..., None], 0.0), counts


def batched_lasr_logmel(padded: torch.Tensor, lengths: torch.Tensor,
                        config: FeatureConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The registered ``lasr_logmel`` extractor."""
    return lasr_logmel(padded, lengths, num_mels=config.num_mel_bins, win_length=config.frame_length,
                       hop=config.frame_shift, n_fft=config.n_fft or N_FFT, sample_rate=config.sample_rate,
                       low_hz=config.low_freq, high_hz=config.high_freq)


def validate_lasr(config: FeatureConfig) -> None:
    """The recipe's fixed choices: a symmetric Hann window, no pre-emphasis or dither, a mel range below Nyquist."""
    if config.window_type != WINDOW:
        raise ConfigError(f"lasr_logmel: window_type must be {WINDOW!r} (LASR's window), got {config.window_type!r}",
                          key="window_type")
    if config.preemphasis not in (None, 0.0):
        raise ConfigError(f"lasr_logmel has no pre-emphasis; got preemphasis={config.preemphasis}", key="preemphasis")
    if config.dither:
        raise ConfigError(f"lasr_logmel has no dither; got dither={config.dither}", key="dither")
    n_fft = config.n_fft or N_FFT
    if config.frame_length > n_fft:
        raise ConfigError(f"lasr_logmel: window of {config.frame_length} samples exceeds n_fft={n_fft}", key="n_fft")
    if not 0.0 <= config.low_freq < config.high_freq <= config.sample_rate / 2:
        raise ConfigError(f"lasr_logmel: mel range {config.low_freq} .. {config.high_freq} Hz must lie in "
                          f"[0, {config.sample_rate / 2}] with low < high", key="high_freq")

