"""The offline FastConformer encoder (NeMo's Parakeet encoder, transformers' ``ParakeetEncoder``) on the waist.

Module names are transformers' (``subsampling.layers.N``, ``layers.N.self_attn.relative_k_proj`` ...), so a
Hugging Face state dict loads 1:1.  The forward map:

- subsampling (NeMo ``dw_striding``): Conv2d(1 → C, k 3, s 2, p 1) → ReLU, then per further stage a
  depthwise Conv2d(k 3, s 2, p 1) → pointwise Conv2d(1×1) → ReLU, over (B, C, T, F); after every
  convolution the frames past each row's length are zeroed, so a padded row equals the row alone; the
  (C, F') columns of each frame are flattened channel-major into ``linear``; ``T' = (T - 1) // 2 + 1`` per
  stage;
- ``x * sqrt(hidden_size)`` when ``scale_input``;
- each block: ``x + 0.5 FF1(LN(x))``; ``x + RelMHSA(LN(x))``; ``x + Conv(LN(x))``; ``x + 0.5 FF2(LN(x))``;
  ``LN`` — LayerNorms with bias, eps 1e-5; no final norm after the blocks;
- RelMHSA is Transformer-XL's: scores ``((q + u) kᵀ + rel_shift((q + v) rᵀ)) / sqrt(d)`` where ``r`` is
  ``relative_k_proj`` (no bias) of sinusoids for relative positions ``T - 1 .. -(T - 1)`` (sin and cos
  interleaved per frequency); ``rel_shift`` picks, for query i and key j, the position ``i - j``;
- the convolution module: pointwise (2D) → GLU → padded frames zeroed → depthwise conv with symmetric
  ``(k - 1) / 2`` padding → BatchNorm → SiLU → pointwise.

On CPU fp32 inference every GEMM of the encoder (feed-forwards, attention and position projections,
pointwise convolutions, the subsampling's ``linear``), offline and streaming, runs through oneDNN's kernel
over a weight prepacked once (core's :mod:`oasr.layers.packed`), the feed-forward's SiLU as its epilogue:
:func:`pack_gemms` gives the encoder's waist ``Linear`` / ``LinearActivation`` / ``PointwiseConv1d`` layers
that forward (same parameters and state-dict keys; the same products as ``F.linear`` up to float32 summation
order).  The packed copies cost a second copy of those weights in memory.
"""

from __future__ import annotations

import torch
from torch import nn

from oasr.layers import (
    BatchNorm1d,
    Conv2d,
    DepthwiseConv1d,
    FeedForward,
    Glu,
    LayerNorm,
    Linear,
    LinearActivation,
    MultiHeadAttention,
    PointwiseConv1d,
    Relu,
    Swish,
    attend,
    merge_heads,
    packed,
)
from oasr.models.base import BaseEncoder
from oasr_models_hf.fastconformer.config import FastConformerConfig

_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
#: base of the relative-position sinusoids (NeMo's RelPositionalEncoding)
POSITION_BASE = 10000.0


def packed_gemm(layer: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """``layer(x)`` through core's prepacked oneDNN GEMM (:mod:`oasr.layers.packed`; a LinearActivation's
    activation fused, over bounded row blocks), or None where that path does not apply (grad enabled, not CPU
    float32, an int8 layer, fewer rows than ``packed.MIN_ROWS``, ``OASR_KERNELS=0``)."""
    if not packed.fusable((layer,), x):
        return None
    activation = layer.activation if isinstance(layer, LinearActivation) else "none"
    return packed.blocked(lambda rows: packed.linear(layer, rows, activation), x)


class _PackedGemm:
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = packed_gemm(self, x)
        return super().forward(x) if out is None else out


class PackedLinear(_PackedGemm, Linear):
    """A waist ``Linear`` whose forward is :func:`packed_gemm` where it applies."""


class PackedLinearActivation(_PackedGemm, LinearActivation):
    """A waist ``LinearActivation`` whose forward is :func:`packed_gemm` (activation fused) where it applies."""


class PackedPointwiseConv1d(_PackedGemm, PointwiseConv1d):
    """A waist ``PointwiseConv1d`` whose forward is :func:`packed_gemm` where it applies."""


_PACKED = {Linear: PackedLinear, LinearActivation: PackedLinearActivation, PointwiseConv1d: PackedPointwiseConv1d}


def pack_gemms(module: nn.Module) -> None:
    """Give every plain waist GEMM layer under ``module`` the prepacked forward (its class becomes the packed
    subclass: no parameter, buffer or key changes)."""
    for child in module.modules():
        cls = _PACKED.get(type(child))
        if cls is not None:
            child.__class__ = cls


def zero_beyond(x: torch.Tensor, lengths: torch.Tensor | None, axis: int) -> torch.Tensor:
    """``x`` with the positions on ``axis`` at or past each row's length set to 0 (rows on axis 0)."""
    if lengths is None:
        return x
    keep = torch.arange(x.shape[axis], device=x.device)[None, :] < lengths[:, None]
    shape = [1] * x.dim()
    shape[0], shape[axis] = keep.shape
    return x * keep.view(shape).to(x.dtype)


class FastConformerSubsampling(nn.Module):
    """Depthwise-separable striding Conv2d subsampling: (B, T, F) → (B, T / factor, hidden)."""

    def __init__(self, config: FastConformerConfig):
        super().__init__()
        k, s, c = config.subsampling_conv_kernel_size, config.subsampling_conv_stride, config.subsampling_conv_channels
        self.kernel_size, self.stride, self.pad = k, s, (k - 1) // 2
        layers: list[nn.Module] = [Conv2d(1, c, k, stride=s, padding=self.pad), Relu()]
        for _ in range(config.subsampling_stages - 1):
            layers += [Conv2d(c, c, k, stride=s, padding=self.pad, groups=c), Conv2d(c, c, 1), Relu()]
        self.layers = nn.ModuleList(layers)
        freq = config.num_mel_bins
        for _ in range(config.subsampling_stages):
            freq = self._length(freq)
        self.linear = Linear(c * freq, config.hidden_size)

    def _length(self, length):
        return (length + 2 * self.pad - self.kernel_size) // self.stride + 1

    def output_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            if isinstance(layer, Conv2d) and layer.stride != 1:
                lengths = self._length(lengths)
        return lengths.clamp_min(0)

    def forward(self, feats: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
        x = zero_beyond(feats, lengths, 1).unsqueeze(1)
        for layer in self.layers:
            x = layer(x)
            if isinstance(layer, Conv2d) and lengths is not None:
                if layer.stride != 1:
                    lengths = self._length(lengths)
                x = zero_beyond(x, lengths, 2)
        batch, channels, frames, freq = x.shape
        return self.linear(x.transpose(1, 2).reshape(batch, frames, channels * freq))


def relative_positions(frames: int, dim: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(2T - 1, dim) sinusoids of relative positions T - 1 .. -(T - 1): [sin, cos] interleaved per frequency."""
    inv_freq = 1.0 / (POSITION_BASE ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim))
    positions = torch.arange(frames - 1, -frames, -1, device=device, dtype=torch.float32)
    angles = positions[:, None] * inv_freq[None, :]
    return torch.stack((angles.sin(), angles.cos()), dim=-1).reshape(2 * frames - 1, dim).to(dtype)


def rel_shift_index(frames: int, device: torch.device) -> torch.Tensor:
    """(T, T) column of the (2T - 1)-wide position table holding relative position i - j for query i, key j."""
    ar = torch.arange(frames, device=device)
    return frames - 1 - ar[:, None] + ar[None, :]


class RelPositionAttention(MultiHeadAttention):
    """Transformer-XL relative-position self-attention with the content (u) and position (v) biases."""

    def __init__(self, config: FastConformerConfig):
        h, heads = config.hidden_size, config.num_attention_heads
        super().__init__(h, heads, names=_PROJECTIONS, bias=(config.attention_bias,) * 4)
        self.relative_k_proj = Linear(h, h, bias=False)
        self.bias_u = nn.Parameter(torch.zeros(heads, h // heads))
        self.bias_v = nn.Parameter(torch.zeros(heads, h // heads))

    def forward(self, x: torch.Tensor, positions: torch.Tensor, shift: torch.Tensor,
                lengths: torch.Tensor | None) -> torch.Tensor:
        q, k, v = self.project(x, 0), self.project(x, 1), self.project(x, 2)
        rel = self.relative_k_proj(positions).view(-1, self.n_heads, self.head_dim).transpose(0, 1)
        scale = self.head_dim ** -0.5
        # (B, H, T, 2T - 1) position scores, then each query's T columns of its own relative offsets
        bd = torch.matmul(q + self.bias_v[None, :, None, :], rel.transpose(-1, -2)[None])
        bd = torch.gather(bd, -1, shift.expand(bd.shape[0], bd.shape[1], -1, -1)) * scale
        out = attend(q + self.bias_u[None, :, None, :], k, v, key_lengths=lengths, bias=bd, scale=scale)
        return self.o_proj(merge_heads(out))


class FastConformerConvolution(nn.Module):
    def __init__(self, config: FastConformerConfig):
        super().__init__()
        h, k, bias = config.hidden_size, config.conv_kernel_size, config.convolution_bias
        self.pointwise_conv1 = PointwiseConv1d(h, 2 * h, bias=bias)
        self.glu = Glu(dim=-1)
        self.depthwise_conv = DepthwiseConv1d(h, k, padding=(k - 1) // 2, bias=bias)
        self.norm = BatchNorm1d(h)
        self.activation = Swish()
        self.pointwise_conv2 = PointwiseConv1d(h, h, bias=bias)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
        x = zero_beyond(self.glu(self.pointwise_conv1(x)), lengths, 1)
        return self.pointwise_conv2(self.activation(self.norm(self.depthwise_conv(x))))


class FastConformerBlock(nn.Module):
    def __init__(self, config: FastConformerConfig):
        super().__init__()
        h = config.hidden_size
        ff = dict(activation="silu", names=("linear1", "linear2"), bias=config.attention_bias)
        self.feed_forward1 = FeedForward(h, config.intermediate_size, **ff)
        self.self_attn = RelPositionAttention(config)
        self.conv = FastConformerConvolution(config)
        self.feed_forward2 = FeedForward(h, config.intermediate_size, **ff)
        for name in ("norm_feed_forward1", "norm_self_att", "norm_conv", "norm_feed_forward2", "norm_out"):
            setattr(self, name, LayerNorm(h))

    def forward(self, x: torch.Tensor, positions: torch.Tensor, shift: torch.Tensor,
                lengths: torch.Tensor | None) -> torch.Tensor:
        x = x + 0.5 * self.feed_forward1(self.norm_feed_forward1(x))
        x = x + self.self_attn(self.norm_self_att(x), positions, shift, lengths)
        x = x + self.conv(self.norm_conv(x), lengths)
        x = x + 0.5 * self.feed_forward2(self.norm_feed_forward2(x))
        return self.norm_out(x)


class FastConformerEncoder(BaseEncoder):
    """Log-mel (B, T, n_mels) → hidden (B, T', hidden_size), T' ≈ T / subsampling_factor.  Offline only."""

    streaming_kind = "none"

    def __init__(self, config: FastConformerConfig):
        super().__init__()
        self.config = config
        self.subsampling_rate = config.subsampling_factor
        self.input_scale = config.hidden_size ** 0.5 if config.scale_input else 1.0
        self.subsampling = FastConformerSubsampling(config)
        self.layers = nn.ModuleList(FastConformerBlock(config) for _ in range(config.num_hidden_layers))
        pack_gemms(self)

    @property
    def output_size(self) -> int:
        return self.config.hidden_size

    def forward(self, feats: torch.Tensor, feat_lens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        batch, frames = feats.shape[:2]
        if feat_lens is None:
            feat_lens = torch.full((batch,), frames, dtype=torch.long, device=feats.device)
        feat_lens = feat_lens.to(feats.device).long()
        if frames == 0:  # no frame at all: one zero frame gives every row length 0 (and decodes to nothing)
            feats, frames = feats.new_zeros(batch, 1, feats.shape[2]), 1
        lengths = self.subsampling.output_lengths(feat_lens)
        padded = bool((feat_lens < frames).any())
        x = self.subsampling(feats, feat_lens if padded else None) * self.input_scale
        t = x.shape[1]
        lengths = lengths.clamp(max=t)
        positions = relative_positions(t, self.config.hidden_size, x.device, x.dtype)
        shift = rel_shift_index(t, x.device)
        key_lengths = lengths if bool((lengths < t).any()) else None
        for layer in self.layers:
            x = layer(x, positions, shift, key_lengths)
        return x, lengths


__all__ = ["FastConformerEncoder", "pack_gemms", "relative_positions"]
