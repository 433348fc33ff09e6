"""The CTC output projection: ``log_softmax(x @ Wᵀ + b)`` in one module."""

from __future__ import annotations

import torch

from oasr.layers.linear import Linear


class CtcProjection(Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(super().forward(x).float(), dim=-1)
