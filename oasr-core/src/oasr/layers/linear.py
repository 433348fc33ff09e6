"""Linear layers of the waist.

Parameters are ``weight`` (out, in) and ``bias`` (out,) as in ``torch.nn.Linear``, so checkpoint keys
map 1:1.  A linear can be switched to int8 weights (per output channel, dynamic activations; see
:mod:`oasr.layers.quant`), which every architecture built from the waist gets for free.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from oasr.layers.activation import activation_fn


class Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self._int8 = None  # set by oasr.layers.quant
        #: a kernel may read this float32 weight as a bfloat16 copy (set by oasr.layers.quant from a QuantLayout's
        #: ``read_bf16``; the forward here stays float32)
        self.read_bf16 = False
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._int8 is not None:
            return self._int8(x, self.bias)
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        q = ", int8" if self._int8 is not None else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}{q}"


class LinearActivation(Linear):
    """``activation(x @ W.T + b)`` — the activation is the GEMM's epilogue; keys stay flat."""

    def __init__(self, in_features: int, out_features: int, activation: str, bias: bool = True):
        super().__init__(in_features, out_features, bias)
        self.activation = activation
        self._act = activation_fn(activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._act(super().forward(x))

    def extra_repr(self) -> str:
        return super().extra_repr() + f", activation={self.activation}"
