"""Slaney-style mel filter banks (librosa's ``filters.mel(norm="slaney")``), used by the Whisper and
NeMo recipes.

The triangles are built in float64 and rounded to float32 before the area normalization, which is
then applied and rounded again: that is librosa's float32 result bit for bit (and therefore the
``mel_filters.npz`` openai-whisper ships, and transformers' ``mel_filter_bank(..., dtype=float32)``).
"""

from __future__ import annotations

import functools

import numpy as np
import torch

_F_SP = 200.0 / 3.0
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP
_LOGSTEP = np.log(6.4) / 27.0


def hz_to_slaney_mel(freq: np.ndarray) -> np.ndarray:
    freq = np.asarray(freq, dtype=np.float64)
    mel = freq / _F_SP
    log_region = freq >= _MIN_LOG_HZ
    return np.where(log_region, _MIN_LOG_MEL + np.log(np.maximum(freq, 1e-300) / _MIN_LOG_HZ) / _LOGSTEP, mel)


def slaney_mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    freq = _F_SP * mel
    return np.where(mel >= _MIN_LOG_MEL, _MIN_LOG_HZ * np.exp(_LOGSTEP * (mel - _MIN_LOG_MEL)), freq)


@functools.lru_cache(maxsize=32)
def _slaney_filters(num_mels: int, n_fft: int, sample_rate: int, f_min: float, f_max: float) -> np.ndarray:
    bins = n_fft // 2 + 1
    fft_freqs = np.linspace(0.0, sample_rate // 2, bins)
    mel_points = np.linspace(hz_to_slaney_mel(f_min), hz_to_slaney_mel(f_max), num_mels + 2)
    edges = slaney_mel_to_hz(mel_points)
    widths = np.diff(edges)
    offsets = edges[None, :] - fft_freqs[:, None]
    rising = -offsets[:, :-2] / widths[:-1]
    falling = offsets[:, 2:] / widths[1:]
    triangles = np.maximum(0.0, np.minimum(rising, falling)).astype(np.float32)
    triangles *= (2.0 / (edges[2:] - edges[:-2]))[None, :]
    return np.ascontiguousarray(triangles.T)


def slaney_mel_filters(num_mels: int, n_fft: int, sample_rate: int, f_min: float = 0.0,
                       f_max: float | None = None) -> torch.Tensor:
    """(num_mels, n_fft // 2 + 1) float32 slaney-normalized triangular filters on the slaney mel scale."""
    f_max = sample_rate / 2.0 if f_max is None else f_max
    return torch.from_numpy(_slaney_filters(num_mels, n_fft, sample_rate, float(f_min), float(f_max)).copy())
