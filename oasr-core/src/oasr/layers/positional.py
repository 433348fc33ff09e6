"""Sinusoidal position tables."""

from __future__ import annotations

import math

import torch


def sinusoid_table(length: int, dim: int, *, base: float = 10000.0, interleaved: bool = True,
                   dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(length, dim) table.  ``interleaved``: sin on even, cos on odd columns (ESPnet/WeNet);
    otherwise the first half sin, the second half cos (Whisper)."""
    position = torch.arange(length, dtype=torch.float32)[:, None]
    if interleaved:
        div = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * -(math.log(base) / dim))
        table = torch.zeros(length, dim)
        table[:, 0::2] = torch.sin(position * div)
        table[:, 1::2] = torch.cos(position * div)
    else:
        inc = math.log(base) / (dim // 2 - 1)
        inv = torch.exp(-inc * torch.arange(dim // 2, dtype=torch.float32))
        scaled = position * inv[None, :]
        table = torch.cat([torch.sin(scaled), torch.cos(scaled)], dim=1)
    return table.to(dtype)
