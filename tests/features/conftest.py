"""Signals for the feature tests: synthetic, non-stationary, with digital silence and near-silence."""

from __future__ import annotations

import math

import pytest
import torch


def speech_like(num_samples: int, sample_rate: int = 16000, seed: int = 0) -> torch.Tensor:
    """Chirp + AM tone + pulse train + noise bursts, a digital-silence gap and a quiet tail; peak < 1."""
    if num_samples == 0:
        return torch.zeros(0)
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(num_samples, dtype=torch.float64) / sample_rate
    nyq = sample_rate / 2
    chirp = 0.25 * torch.sin(2 * math.pi * (100 + 0.3 * nyq * t / max(t[-1].item(), 1e-3)) * t)
    am = 0.2 * torch.sin(2 * math.pi * 0.17 * nyq * t) * (0.5 + 0.5 * torch.sin(2 * math.pi * 3 * t))
    pulses = torch.zeros_like(t)
    pulses[:: max(1, sample_rate // 120)] = 0.4
    noise = 0.05 * torch.randn(num_samples, generator=g, dtype=torch.float64)
    burst = (torch.sin(2 * math.pi * 1.3 * t) > 0.6).double()
    x = chirp + am + pulses + noise * (0.2 + burst)
    if num_samples > 4000:
        gap = slice(num_samples // 3, num_samples // 3 + min(2400, num_samples // 6))
        x[gap] = 0.0
        x[-num_samples // 8:] *= 1e-3
    return (x / (x.abs().max() * 1.25)).float()


@pytest.fixture
def signal():
    return speech_like
