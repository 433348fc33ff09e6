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
  ``(k - 1) / 2`` padding → BatchNorm → SiLU → pointwise; on CPU fp32 inference the depthwise conv reads the
  (B, T, C) activations channels-last with the BatchNorm folded into its weights and the SiLU as its epilogue
  (:func:`oasr.layers.packed.depthwise_norm_activation`).

On CPU fp32 inference every GEMM of the encoder (feed-forwards, attention and position projections,
pointwise convolutions, the subsampling's ``linear``), offline and streaming, runs over a weight prepacked once
(core's :mod:`oasr.layers.packed`): MKL's sgemm at the call's own row count where torch has MKL (the SiLU and
the residual adds one in-place pass each), else oneDNN's kernel with them as its epilogue:
:func:`pack_gemms` gives the encoder's waist ``Linear`` / ``LinearActivation`` / ``PointwiseConv1d`` layers
that forward (same parameters and state-dict keys; the same products as ``F.linear`` up to float32 summation
order).  The packed copies cost a second copy of those weights in memory.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.modules.utils import _pair

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
from oasr.layers.derived import SameValues, derived
from oasr.models.base import BaseEncoder
from oasr_models_hf.fastconformer.config import FastConformerConfig

_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
#: base of the relative-position sinusoids (NeMo's RelPositionalEncoding)
POSITION_BASE = 10000.0


#: the encoder's GEMMs run MKL's packed sgemm at each call's own row count (:func:`oasr.layers.packed.sgemm`), where
#: torch has MKL; elsewhere oneDNN's kernel over :func:`rows_blocked` row blocks.  One clip per call (25-150 rows)
#: the blocks cost a second weight pass and the tail's pad and cat: the 110M encoder over 20 clips of 2-12 s ran
#: 1.32-1.39x faster on the sgemm, batches of 8 1.13-1.15x (Intel Xeon, one thread; docs/benchmarks.md § Parakeet)
SGEMM = packed.sgemm_available()

#: rows of a packed GEMM past its whole :data:`oasr.layers.packed.MIN_ROWS`-row blocks run as one tail padded to
#: a multiple of this, so oneDNN sees few row counts (64-row multiples up to a block, and 16, 32, 48) and a short
#: clip or tail wastes at most 15 rows (padding every row count to 64 cost a 100-frame clip 28 % of its GEMMs;
#: one 512 x 2048 GEMM of 16-48 rows runs at the 64-row block's GFLOP/s, MKL's unpacked sgemm 30-40 % slower)
TAIL_ROWS = 16


def rows_blocked(fn, *tensors: torch.Tensor) -> torch.Tensor:
    """``fn(*tensors)`` for a row-wise ``fn`` whose packed calls take ``min_rows=TAIL_ROWS``: the whole
    ``MIN_ROWS``-row blocks through :func:`oasr.layers.packed.blocked`, the remaining rows as one tail padded to
    a multiple of :data:`TAIL_ROWS`."""
    x = tensors[0]
    rows = x.numel() // x.size(-1)
    flat = [t.reshape(rows, t.size(-1)) for t in tensors]
    whole = rows - rows % packed.MIN_ROWS
    outs = [packed.blocked(fn, *(t[:whole] for t in flat))] if whole else []
    if whole < rows:
        pad = -(rows - whole) % TAIL_ROWS
        tail = fn(*(F.pad(t[whole:], (0, 0, 0, pad)) if pad else t[whole:] for t in flat))
        outs.append(tail[:rows - whole] if pad else tail)
    out = outs[0] if len(outs) == 1 else torch.cat(outs)
    return out.reshape(*x.shape[:-1], out.size(-1))


def packed_gemm(layer: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """``layer(x)`` through core's prepacked GEMMs (:mod:`oasr.layers.packed`: MKL's sgemm where :data:`SGEMM`,
    else oneDNN's over :func:`rows_blocked` row blocks; a LinearActivation's activation with it), or None where
    that path does not apply (grad enabled, not CPU float32, an int8 layer, no rows, ``OASR_KERNELS=0``)."""
    if x.numel() == 0 or not packed.fusable((layer,), x, min_rows=1):
        return None
    activation = layer.activation if isinstance(layer, LinearActivation) else "none"
    if SGEMM:
        return packed.sgemm(layer, x, activation)
    return rows_blocked(lambda rows: packed.linear(layer, rows, activation, min_rows=TAIL_ROWS), x)


def gemm_add(layer: nn.Module, x: torch.Tensor, residual: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """``residual + scale * layer(x)``; on the packed path the scaled add is one in-place pass over the sgemm's
    output, or (oneDNN) the GEMM's epilogue with the scale folded into the packed weight."""
    if SGEMM and x.numel():  # sgemm runs the reference ops itself where its fast path does not apply
        return packed.sgemm(layer, x, residual=residual, scale=scale)
    if x.numel() == 0 or not packed.fusable((layer,), x, min_rows=1) or residual.shape[:-1] != x.shape[:-1]:
        y = layer(x)
        return residual + (scale * y if scale != 1.0 else y)
    return rows_blocked(lambda rows, res: packed.linear_add(layer, rows, res, scale=scale, min_rows=TAIL_ROWS),
                        x, residual)


class _PackedGemm:
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # a Linear: sgemm runs its reference ops itself where its fast path does not apply (one check a call);
        # a PointwiseConv1d's reference is its own call, so it asks packed_gemm first
        if SGEMM and x.numel() and isinstance(self, Linear):
            return packed.sgemm(self, x, self.activation if isinstance(self, LinearActivation) else "none")
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
        """(B, T, F) → (B, T', hidden).  Under inference a batch's convolutions run row by row over each row's
        own frames (what the padded, masked batch computes on its valid frames; frames past a row's length are
        zero before ``linear``): the stem's (B, C, T / 2, F / 2) output of a batch of 8 ten-second clips is
        160 MB, and every pass over tensors that size (fresh pages, no cache) cost 4-8x a row's share.  On the
        packed path the rows take :meth:`_packed_columns`."""
        batch, frames = feats.shape[:2]
        fast = self._fusable(feats)
        if not fast and (torch.is_grad_enabled() or batch == 1):
            return self.linear(self._columns(self._convolutions(feats, lengths)))
        columns = self._packed_columns if fast else (lambda f: self._columns(self._convolutions(f, None)))
        linear = self._packed()[1] if fast else self.linear
        if lengths is None:  # every row whole: no frame reads padding
            return linear(columns(feats))
        x = None
        for b, n in enumerate(lengths.tolist()):
            row = columns(feats[b:b + 1, :max(int(n), 1)])[0]
            if x is None:
                x = row.new_zeros(batch, int(self.output_lengths(torch.tensor(frames))), row.shape[-1])
            x[b, :row.shape[0]] = row
        return linear(x)

    def _fusable(self, feats: torch.Tensor) -> bool:
        """Whether the convolutions take :meth:`_packed_columns` (CPU fp32 inference, oneDNN, kernels on)."""
        return packed.fusable([m for m in self.layers if isinstance(m, Conv2d)] + [self.linear], feats, min_rows=1)

    def _packed(self) -> tuple[list[tuple[Conv2d, torch.Tensor, str]], Linear]:
        """Each convolution with its weight reordered once for oneDNN and its epilogue ("relu" where a ReLU follows
        it), and ``linear`` with its input columns permuted from the channel-major (C, F') flattening to the
        channels-last (F', C) one, so it reads the last convolution's output as it lies."""
        convs = [(m, "relu" if i + 1 < len(self.layers) and isinstance(self.layers[i + 1], Relu) else "none")
                 for i, m in enumerate(self.layers) if isinstance(m, Conv2d)]

        def build():
            weights = [(conv, packed.conv2d_weight(conv, [1, conv.in_channels, 64, 64]), post) for conv, post in convs]
            return weights, packed.channels_last_columns(self.linear, convs[-1][0].out_channels, PackedLinear)

        sources = [t for m in (*(conv for conv, _ in convs), self.linear) for t in (m.weight, m.bias)]
        return derived(self, "packed_subsampling", sources, build)

    def _packed_columns(self, feats: torch.Tensor) -> torch.Tensor:
        """(B, T, F) → (B, T', F'·C): the convolutions as oneDNN convolutions over reordered weights, channels-last
        (no layout change between them), each ReLU their epilogue; each frame's columns frequency-major, as the
        permuted ``linear`` of :meth:`_packed` reads them (every row whole)."""
        x = feats.unsqueeze(1).contiguous(memory_format=torch.channels_last)
        for conv, weight, post in self._packed()[0]:
            x = torch.ops.mkldnn._convolution_pointwise(x, weight, conv.bias, _pair(conv.padding), _pair(conv.stride),
                                                        [1, 1], conv.groups, post, [], "")
        batch, channels, frames, freq = x.shape
        return x.permute(0, 2, 3, 1).reshape(batch, frames, freq * channels)

    def _convolutions(self, feats: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
        """(B, T, F) → (B, C, T', F') through the convolution stack, the frames past each row's length zeroed
        after every convolution (``lengths`` None: every row is whole)."""
        x = zero_beyond(feats, lengths, 1).unsqueeze(1)
        for layer in self.layers:
            if isinstance(layer, Relu) and not torch.is_grad_enabled():
                # in place in the preceding convolution's own output; the depthwise stages after the stem run
                # channels-last (oneDNN's depthwise kernel is 1.1-1.9x faster on it than on NCHW)
                x = x.relu_().contiguous(memory_format=torch.channels_last)
                continue
            x = layer(x)
            if isinstance(layer, Conv2d) and lengths is not None:
                if layer.stride != 1:
                    lengths = self._length(lengths)
                x = zero_beyond(x, lengths, 2)
        return x

    @staticmethod
    def _columns(x: torch.Tensor) -> torch.Tensor:
        """(B, C, T', F') → (B, T', C·F'): each frame's columns channel-major, as ``linear`` reads them."""
        batch, channels, frames, freq = x.shape
        return x.transpose(1, 2).reshape(batch, frames, channels * freq)


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


#: the largest relative-position projection an attention layer keeps (elements; 4 MB of float32): 1024 frames of
#: a 512-wide Parakeet table, the whole offline table of NemotronEncoder's query blocks, one streaming chunk's
POSITION_CACHE_ELEMENTS = 1 << 20


class RelPositionAttention(MultiHeadAttention):
    """Transformer-XL relative-position self-attention with the content (u) and position (v) biases."""

    def __init__(self, config: FastConformerConfig):
        h, heads = config.hidden_size, config.num_attention_heads
        super().__init__(h, heads, names=_PROJECTIONS, bias=(config.attention_bias,) * 4)
        self.relative_k_proj = Linear(h, h, bias=False)
        self.bias_u = nn.Parameter(torch.zeros(heads, h // heads))
        self.bias_v = nn.Parameter(torch.zeros(heads, h // heads))

    def position_keys(self, table: torch.Tensor, rows: slice | None = None) -> torch.Tensor:
        """``relative_k_proj(table)[rows]`` as (H, P, d).  The projection depends on the table and the weight only,
        so on the packed (inference) path the last one is kept (up to :data:`POSITION_CACHE_ELEMENTS`) and reused
        while the same table comes in (the same tensor, or an equal one) and the weight is unchanged."""
        if table.numel() <= POSITION_CACHE_ELEMENTS and packed.fusable((self.relative_k_proj,), table, min_rows=1):
            proj = derived(self, "position_keys", [self.relative_k_proj.weight], lambda: self.relative_k_proj(table),
                           extra=SameValues(table))
        else:
            proj = self.relative_k_proj(table)
        if rows is not None:
            proj = proj[rows]
        return proj.view(-1, self.n_heads, self.head_dim).transpose(0, 1)

    def position_scores(self, q: torch.Tensor, rel: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
        """(N, H, Q, K) scaled position scores: each query's columns of ``(q + v) relᵀ`` at its own offsets."""
        bd = torch.matmul(q + self.bias_v[None, :, None, :], rel.transpose(-1, -2)[None])
        return torch.gather(bd, -1, shift.expand(bd.shape[0], bd.shape[1], -1, -1)).mul_(self.head_dim ** -0.5)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, shift: torch.Tensor,
                lengths: torch.Tensor | None, residual: torch.Tensor | None = None,
                rows: slice | None = None) -> torch.Tensor:
        """``residual + o_proj(attention)`` (``residual`` None: 0); ``positions[rows]`` are the sinusoids of the
        relative positions T - 1 .. -(T - 1)."""
        q, k, v = self.project(x, 0), self.project(x, 1), self.project(x, 2)
        bd = self.position_scores(q, self.position_keys(positions, rows), shift)
        out = merge_heads(attend(q + self.bias_u[None, :, None, :], k, v, key_lengths=lengths, bias=bd,
                                 scale=self.head_dim ** -0.5))
        return self.o_proj(out) if residual is None else gemm_add(self.o_proj, out, residual)


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

    def pointwise_glu(self, x: torch.Tensor) -> torch.Tensor:
        """``glu(pointwise_conv1(x))``; on the packed path one sgemm and ``F.glu``, or (oneDNN) the GLU as the
        epilogue of the two half GEMMs (:func:`oasr.layers.packed.glu_linear`)."""
        if SGEMM and x.numel():
            return F.glu(packed.sgemm(self.pointwise_conv1, x), dim=-1)
        if x.numel() == 0 or not packed.fusable((self.pointwise_conv1,), x, min_rows=1):
            return self.glu(self.pointwise_conv1(x))
        return rows_blocked(lambda rows: packed.glu_linear(self.pointwise_conv1, rows, min_rows=TAIL_ROWS), x)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None,
                residual: torch.Tensor | None = None) -> torch.Tensor:
        """``residual + conv(x)`` (``residual`` None: 0)."""
        x = zero_beyond(self.pointwise_glu(x), lengths, 1)
        x = packed.depthwise_norm_activation(self.depthwise_conv, self.norm, self.activation, x)
        return self.pointwise_conv2(x) if residual is None else gemm_add(self.pointwise_conv2, x, residual)


def macaron(ff: FeedForward, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """``residual + 0.5 * ff(x)`` (the second linear's epilogue adds the residual on the packed path)."""
    first, second = (getattr(ff, name) for name in ff.names)
    return gemm_add(second, first(x), residual, 0.5)


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
                lengths: torch.Tensor | None, rows: slice | None = None) -> torch.Tensor:
        x = macaron(self.feed_forward1, self.norm_feed_forward1(x), x)
        x = self.self_attn(self.norm_self_att(x), positions, shift, lengths, residual=x, rows=rows)
        x = self.conv(self.norm_conv(x), lengths, residual=x)
        x = macaron(self.feed_forward2, self.norm_feed_forward2(x), x)
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
        self._table: torch.Tensor | None = None
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
        positions, rows = self.position_table(x, t)
        shift = rel_shift_index(t, x.device)
        key_lengths = lengths if bool((lengths < t).any()) else None
        for layer in self.layers:
            x = layer(x, positions, shift, key_lengths, rows)
        return x, lengths

    def position_table(self, x: torch.Tensor, frames: int) -> tuple[torch.Tensor, slice | None]:
        """The relative-position sinusoids for ``frames`` frames, and which of its rows they are.  On the packed
        (inference) path one table of ``M - 1 .. -(M - 1)`` (M a power of two ≥ frames, while within
        :data:`POSITION_CACHE_ELEMENTS`) is kept, so each layer's projection of it is computed once and sliced
        (the rows of ``T - 1 .. -(T - 1)`` are ``M - T .. M + T - 2``); elsewhere the table of ``frames``."""
        dim = self.config.hidden_size
        span = max(64, 1 << (frames - 1).bit_length())
        if (2 * span - 1) * dim > POSITION_CACHE_ELEMENTS or not packed.fusable((), x, min_rows=1):
            return relative_positions(frames, dim, x.device, x.dtype), None
        table = self._table
        if table is None or table.shape[0] < 2 * frames - 1 or table.dtype != x.dtype or table.device != x.device:
            table = self._table = relative_positions(span, dim, x.device, x.dtype)
        span = (table.shape[0] + 1) // 2
        return table, slice(span - frames, span + frames - 1)


__all__ = ["FastConformerEncoder", "pack_gemms", "relative_positions"]
