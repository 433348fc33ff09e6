"""The inference side of icefall's ``scaling.py``: the pieces Zipformer2 is made of.

Training-only modules (Balancer, Whiten, ScaleGrad, dropout schedules) are the identity in an
evaluation forward and are left out; every parameter icefall saves has a home here under the same
name.  Activations follow icefall's evaluation formulas (the softplus by ``F.softplus``, equal up
to float rounding): ``SwooshL(x) = log(1 + exp(x - 4)) - 0.08 x - 0.035`` and
``SwooshR(x) = log(1 + exp(x - 1)) - 0.08 x - 0.313261687``.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from oasr import layers


def swoosh_l(x: torch.Tensor) -> torch.Tensor:
    """icefall's ``SwooshLForward``: softplus(x - 4) - 0.08 x - 0.035 (softplus is x - 4 past 20)."""
    return F.softplus(x - 4.0).sub_(x, alpha=0.08).sub_(0.035)


def swoosh_r(x: torch.Tensor) -> torch.Tensor:
    """icefall's ``SwooshRForward``: softplus(x - 1) - 0.08 x - 0.313261687."""
    return F.softplus(x - 1.0).sub_(x, alpha=0.08).sub_(0.313261687)


class SwooshL(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return swoosh_l(x)


class SwooshR(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return swoosh_r(x)


_SWOOSH = {"SwooshL": swoosh_l, "SwooshR": swoosh_r}


class ActivationDropoutAndLinear(layers.Linear):
    """icefall's fused ``activation → dropout → linear`` (keys ``weight``/``bias``): at inference
    the activation applied to the input of a plain linear.  The activation precedes the GEMM, so no
    epilogue fusion applies."""

    def __init__(self, in_channels: int, out_channels: int, activation: str, bias: bool = True):
        if activation not in _SWOOSH:
            raise ValueError(f"activation must be one of {', '.join(_SWOOSH)}, got {activation!r}")
        super().__init__(in_channels, out_channels, bias)
        self.activation = activation
        self._act = _SWOOSH[activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(self._act(x))


class BiasNorm(nn.Module):
    """``x * exp(log_scale) / rms(x - bias)`` over ``channel_dim`` (icefall's LayerNorm replacement:
    the bias only enters the scale, not the output)."""

    def __init__(self, num_channels: int, channel_dim: int = -1):
        super().__init__()
        self.num_channels = num_channels
        self.channel_dim = channel_dim
        self.log_scale = nn.Parameter(torch.tensor(1.0))
        self.bias = nn.Parameter(torch.zeros(num_channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dim = self.channel_dim % x.ndim
        bias = self.bias.reshape((-1,) + (1,) * (x.ndim - dim - 1))
        scales = torch.mean((x - bias) ** 2, dim=dim, keepdim=True) ** -0.5 * self.log_scale.exp()
        return x * scales


class BypassModule(nn.Module):
    """Learned per-channel interpolation ``src_orig + (src - src_orig) * bypass_scale`` (a lerp, so
    it cannot share the add+norm fusion of pre-norm residual streams)."""

    def __init__(self, embed_dim: int):
        super().__init__()
        self.bypass_scale = nn.Parameter(torch.full((embed_dim,), 0.5))

    def forward(self, src_orig: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        return src_orig + (src - src_orig) * self.bypass_scale


class ChunkCausalDepthwiseConv1d(nn.Module):
    """A depthwise convolution that is causal chunk by chunk (causal releases).

    ``causal_conv`` (half the kernel, left-padded) sees the past; ``chunkwise_conv`` (the full
    kernel) sees only its own chunk and is scaled by a learned position-in-chunk profile
    (``chunkwise_conv_scale``: left and right edges).  Input and output are (B, C, T).
    """

    def __init__(self, channels: int, kernel_size: int):
        super().__init__()
        if kernel_size % 2 != 1:
            raise ValueError(f"kernel_size must be odd, got {kernel_size}")
        self.kernel_size = kernel_size
        self.causal_conv = layers.Conv1d(channels, channels, (kernel_size + 1) // 2, groups=channels)
        self.chunkwise_conv = layers.Conv1d(channels, channels, kernel_size, padding=kernel_size // 2,
                                            groups=channels)
        self.chunkwise_conv_scale = nn.Parameter(torch.zeros(2, channels, kernel_size))

    def forward(self, x: torch.Tensor, chunk_size: int = -1) -> torch.Tensor:
        batch, channels, seq_len = x.shape
        left_pad = self.kernel_size // 2
        if chunk_size < 0 or chunk_size > seq_len:
            chunk_size = seq_len
        right_pad = -seq_len % chunk_size
        x = nn.functional.pad(x, (left_pad, right_pad))
        x_causal = self.causal_conv.forward_bct(x[..., : left_pad + seq_len])
        x_chunk = x[..., left_pad:]
        num_chunks = x_chunk.shape[2] // chunk_size
        x_chunk = x_chunk.reshape(batch, channels, num_chunks, chunk_size).permute(0, 2, 1, 3)
        x_chunk = self.chunkwise_conv.forward_bct(x_chunk.reshape(batch * num_chunks, channels, chunk_size))
        x_chunk = x_chunk * self.chunk_scale(chunk_size)
        x_chunk = x_chunk.reshape(batch, num_chunks, channels, chunk_size).permute(0, 2, 1, 3)
        return x_chunk.reshape(batch, channels, num_chunks * chunk_size)[..., :seq_len] + x_causal

    def chunk_scale(self, chunk_size: int) -> torch.Tensor:
        """(C, chunk_size): ``1 + left edge + right edge`` of the learned in-chunk profile."""
        left_edge, right_edge = self.chunkwise_conv_scale[0], self.chunkwise_conv_scale[1]
        if chunk_size < self.kernel_size:
            left_edge = left_edge[:, :chunk_size]
            right_edge = right_edge[:, -chunk_size:]
        else:
            pad = left_edge.new_zeros(left_edge.shape[0], chunk_size - self.kernel_size)
            left_edge = torch.cat((left_edge, pad), dim=-1)
            right_edge = torch.cat((pad, right_edge), dim=-1)
        return 1.0 + (left_edge + right_edge)


class SimpleDownsample(nn.Module):
    """Downsampling by a learned softmax-weighted sum of each group of ``downsample`` frames; a
    partial last group is completed by repeating the last frame.  (T, B, C) in and out."""

    def __init__(self, downsample: int):
        super().__init__()
        self.downsample = downsample
        self.bias = nn.Parameter(torch.zeros(downsample))

    def forward(self, src: torch.Tensor) -> torch.Tensor:
        seq_len, batch, channels = src.shape
        ds = self.downsample
        d_seq_len = (seq_len + ds - 1) // ds
        pad = d_seq_len * ds - seq_len
        if pad > 0:
            src = torch.cat((src, src[-1:].expand(pad, batch, channels)), dim=0)
        src = src.reshape(d_seq_len, ds, batch, channels)
        weights = self.bias.softmax(dim=0).unsqueeze(-1).unsqueeze(-1)
        return (src * weights).sum(dim=1)


class SimpleUpsample(nn.Module):
    """Each frame repeated ``upsample`` times; (T, B, C) → (T * upsample, B, C)."""

    def __init__(self, upsample: int):
        super().__init__()
        self.upsample = upsample

    def forward(self, src: torch.Tensor) -> torch.Tensor:
        seq_len, batch, channels = src.shape
        src = src.unsqueeze(1).expand(seq_len, self.upsample, batch, channels)
        return src.reshape(seq_len * self.upsample, batch, channels)


class CompactRelPositionalEncoding(nn.Module):
    """icefall's compact relative positional encoding: offsets compressed by a log then atan into a
    bounded interval before the Fourier features; the last dimension is a constant 1 (a bias).

    The table is a plain cached attribute (never a checkpoint tensor); it covers at least offsets
    ±1999 as icefall's does, and grows when a longer input needs it.
    """

    def __init__(self, embed_dim: int, max_len: int = 2000, length_factor: float = 1.0):
        super().__init__()
        if embed_dim % 2 != 0:
            raise ValueError(f"pos_dim must be even, got {embed_dim}")
        self.embed_dim = embed_dim
        self.length_factor = length_factor
        self.max_len = max_len
        self._pe: torch.Tensor | None = None

    def table(self, length: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """The (2 L - 1, pos_dim) table for offsets L-1 … -(L-1), L ≥ ``length``."""
        pe = self._pe
        if pe is None or pe.shape[0] < 2 * length - 1:
            total = max(length, self.max_len)
            x = torch.arange(-(total - 1), total, device=device).to(torch.float32).unsqueeze(1)
            freqs = 1 + torch.arange(self.embed_dim // 2, device=device)
            compression = self.embed_dim ** 0.5
            x_compressed = compression * x.sign() * ((x.abs() + compression).log() - math.log(compression))
            length_scale = self.length_factor * self.embed_dim / (2.0 * math.pi)
            x_atan = (x_compressed / length_scale).atan()
            pe = torch.zeros(x.shape[0], self.embed_dim, device=device)
            pe[:, 0::2] = (x_atan * freqs).cos()
            pe[:, 1::2] = (x_atan * freqs).sin()
            pe[:, -1] = 1.0
            self._pe = pe
        if pe.device != device or pe.dtype != dtype:
            pe = self._pe = pe.to(device=device, dtype=dtype)
        return pe

    def forward(self, x: torch.Tensor, left_context_len: int = 0) -> torch.Tensor:
        """(1, left_context_len + 2 T - 1, pos_dim) for x of shape (T, B, ...)."""
        seq_len = x.shape[0]
        pe = self.table(seq_len + left_context_len, x.device, x.dtype)
        centre = pe.shape[0] // 2
        return pe[centre - (seq_len + left_context_len) + 1: centre + seq_len].unsqueeze(0)


def convert_num_channels(x: torch.Tensor, num_channels: int) -> torch.Tensor:
    """Keep the first ``num_channels`` channels, or zero-pad up to them."""
    if num_channels <= x.shape[-1]:
        return x[..., :num_channels]
    return torch.cat((x, x.new_zeros(*x.shape[:-1], num_channels - x.shape[-1])), dim=-1)
