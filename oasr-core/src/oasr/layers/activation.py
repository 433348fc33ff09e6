"""Activation modules of the layer waist (standalone, for places a GEMM epilogue cannot take them)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "swish", "silu", "tanh", "sigmoid", "identity")


def activation_fn(name: str):
    """``name`` → a tensor function.  ``gelu`` is exact erf; ``gelu_tanh`` the tanh approximation."""
    name = name.lower()
    table = {
        "relu": F.relu,
        "gelu": F.gelu,
        "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
        "swish": F.silu,
        "silu": F.silu,
        "tanh": torch.tanh,
        "sigmoid": torch.sigmoid,
        "identity": lambda x: x,
    }
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown activation {name!r}; expected one of {', '.join(ACTIVATIONS)}") from None


class Activation(nn.Module):
    def __init__(self, name: str):
        super().__init__()
        self.name = name
        self._fn = activation_fn(name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._fn(x)

    def extra_repr(self) -> str:
        return self.name


class Relu(Activation):
    def __init__(self):
        super().__init__("relu")


class Gelu(Activation):
    def __init__(self, approximate: str = "none"):
        super().__init__("gelu_tanh" if approximate == "tanh" else "gelu")


class Swish(Activation):
    def __init__(self):
        super().__init__("swish")


class Tanh(Activation):
    def __init__(self):
        super().__init__("tanh")


class Sigmoid(Activation):
    def __init__(self):
        super().__init__("sigmoid")


class Glu(nn.Module):
    """Gated linear unit over ``dim`` (first half × sigmoid(second half))."""

    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.glu(x, dim=self.dim)
