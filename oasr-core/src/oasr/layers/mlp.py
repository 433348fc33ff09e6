"""Feed-forward blocks of the waist."""

from __future__ import annotations

import torch
from torch import nn

from oasr.layers.linear import Linear, LinearActivation


class FeedForward(nn.Module):
    """``w_2(act(w_1(x)))`` with the two linears named as the checkpoint names them."""

    def __init__(self, d_model: int, hidden: int, activation: str = "relu", *,
                 names: tuple[str, str] = ("w_1", "w_2"), bias: bool | tuple[bool, bool] = True):
        super().__init__()
        b1, b2 = (bias, bias) if isinstance(bias, bool) else bias
        self.names = names
        setattr(self, names[0], LinearActivation(d_model, hidden, activation, bias=b1))
        setattr(self, names[1], Linear(hidden, d_model, bias=b2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self, self.names[1])(getattr(self, self.names[0])(x))


class GatedMLP(nn.Module):
    """``down(act(gate(x)) * up(x))`` (LLaMA/Qwen style)."""

    def __init__(self, d_model: int, hidden: int, activation: str = "silu", bias: bool = False):
        super().__init__()
        self.gate_proj = LinearActivation(d_model, hidden, activation, bias=bias)
        self.up_proj = Linear(d_model, hidden, bias=bias)
        self.down_proj = Linear(hidden, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate_proj(x) * self.up_proj(x))
