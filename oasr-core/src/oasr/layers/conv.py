"""Convolutions of the waist.

1-D convolutions take and return (B, T, C) — the layout every encoder keeps between blocks — and
store ``weight`` (out, in/groups, k) and ``bias`` exactly as ``torch.nn.Conv1d`` does.  Padding is
given per side so causal (left-only) convolutions need no special case.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def _init_conv(weight: torch.Tensor, bias: torch.Tensor | None, fan_in: int) -> None:
    nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
    if bias is not None:
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
        nn.init.uniform_(bias, -bound, bound)


class Conv1d(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, *, stride: int = 1,
                 padding: int | tuple[int, int] = 0, dilation: int = 1, groups: int = 1, bias: bool = True):
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride, self.dilation, self.groups = kernel_size, stride, dilation, groups
        self.padding = (padding, padding) if isinstance(padding, int) else tuple(padding)
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels // groups, kernel_size))
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None
        _init_conv(self.weight, self.bias, in_channels // groups * kernel_size)

    def forward_bct(self, x: torch.Tensor) -> torch.Tensor:
        """The same convolution on a (B, C, T) tensor."""
        left, right = self.padding
        if left or right:
            x = F.pad(x, (left, right))
        return F.conv1d(x, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_bct(x.transpose(1, 2)).transpose(1, 2)

    def output_length(self, length: torch.Tensor | int):
        span = self.dilation * (self.kernel_size - 1) + 1
        return (length + sum(self.padding) - span) // self.stride + 1

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, groups={self.groups}, bias={self.bias is not None}")


class DepthwiseConv1d(Conv1d):
    """One filter per channel (groups = channels)."""

    def __init__(self, channels: int, kernel_size: int, *, stride: int = 1,
                 padding: int | tuple[int, int] = 0, bias: bool = True):
        super().__init__(channels, channels, kernel_size, stride=stride, padding=padding, groups=channels, bias=bias)


class PointwiseConv1d(Conv1d):
    """Kernel-size-1 convolution, computed as a GEMM over (B, T, C); keys match ``nn.Conv1d(k=1)``."""

    def __init__(self, in_channels: int, out_channels: int, bias: bool = True):
        super().__init__(in_channels, out_channels, 1, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.squeeze(-1), self.bias)


class Conv2d(nn.Module):
    """A 2-D convolution over (B, C, H, W), as subsampling front-ends use."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | tuple[int, int], *,
                 stride: int | tuple[int, int] = 1, padding: int | tuple[int, int] = 0, groups: int = 1,
                 bias: bool = True):
        super().__init__()
        k = (kernel_size, kernel_size) if isinstance(kernel_size, int) else tuple(kernel_size)
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, k
        self.stride, self.padding, self.groups = stride, padding, groups
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels // groups, *k))
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None
        _init_conv(self.weight, self.bias, in_channels // groups * k[0] * k[1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, 1, self.groups)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}")
