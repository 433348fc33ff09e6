"""The Nemotron ASR encoder (transformers' ``NemotronAsrStreamingEncoder``): a cache-aware FastConformer.

Module names are transformers' (``subsampling.conv_in``, ``subsampling.layers.N.depthwise_conv``,
``layers.N.conv.norm`` ...), so its state dict loads 1:1.  What differs from the Parakeet encoder
(:mod:`oasr_models_hf.fastconformer.encoder`, whose feed-forward / attention projections and LayerNorms the
blocks reuse):

- subsampling is causal: every strided Conv2d pads ``(k - 1, s - 1)`` on both the time and the frequency
  axis, so output frame ``t`` of a stage reads input frames ``s·t - (k - 1) .. s·t``; ``T' = T // s + 1``
  per stage (k 3, s 2); the stem is ``conv_in`` → ReLU, each further stage ``depthwise_conv`` →
  ``pointwise_conv`` → ReLU; frames past each row's length are zeroed after every stage;
- the convolution module's depthwise conv is causal (left padding ``k - 1``) and is followed by a LayerNorm,
  not a BatchNorm;
- self-attention is masked by the trained ``chunked_limited`` rule, offline too: frames are grouped in chunks
  of ``num_lookahead_tokens + 1``; a query sees its own chunk and ``(sliding_window - 1) // chunk`` earlier
  chunks, keys past a row's length never.

Offline attention runs in query blocks: each block of :attr:`NemotronEncoder.offline_block_frames` queries
(rounded up to whole chunks) is scored against its own frames plus the trained history before it, so the scores
and the relative-position table grow with T, not T².  An utterance no longer than twice a block's keys stays one
dense block.  Both forms are exactly the trained mask; the relative positions are Transformer-XL's (query minus
key, sinusoids with base 10 000, sin and cos interleaved per frequency).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from oasr.layers import Conv2d, DepthwiseConv1d, LayerNorm, Linear, Relu, attend, merge_heads
from oasr.models.base import BaseEncoder
from oasr_models_hf.fastconformer.encoder import (
    POSITION_BASE,
    FastConformerBlock,
    FastConformerConvolution,
    RelPositionAttention,
    gemm_add,
    macaron,
    pack_gemms,
    zero_beyond,
)
from oasr_models_hf.fastconformer.nemotron_streaming import NemotronStreamingMixin

#: queries per offline attention block (rounded up to whole trained chunks)
OFFLINE_BLOCK_FRAMES = 64


def sinusoids(positions: torch.Tensor, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """(P, dim) Transformer-XL sinusoids of the relative ``positions`` (sin, cos interleaved per frequency)."""
    inv_freq = 1.0 / (POSITION_BASE ** (torch.arange(0, dim, 2, dtype=torch.float32, device=positions.device) / dim))
    angles = positions.float()[:, None] * inv_freq[None, :]
    return torch.stack((angles.sin(), angles.cos()), dim=-1).reshape(positions.shape[0], dim).to(dtype)


class NemotronSubsampling(nn.Module):
    """Causal depthwise-separable striding Conv2d subsampling: (B, T, F) → (B, T // 8 + ..., hidden)."""

    def __init__(self, config):
        super().__init__()
        k, s, c = config.subsampling_conv_kernel_size, config.subsampling_conv_stride, config.subsampling_conv_channels
        self.kernel_size, self.stride = k, s
        self.conv_in = Conv2d(1, c, k, stride=s)
        self.layers = nn.ModuleList(_SubsamplingStage(c, k, s) for _ in range(config.subsampling_stages - 1))
        self.act = Relu()
        freq = config.num_mel_bins
        for _ in range(config.subsampling_stages):
            freq = self.stage_length(freq)
        self.linear = Linear(c * freq, config.hidden_size)

    def stage_length(self, length):
        """Frames out of one stage for ``length`` in (causal padding ``(k - 1, s - 1)``)."""
        return (length + self.stride - 2) // self.stride + 1

    def output_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        for _ in range(len(self.layers) + 1):
            lengths = self.stage_length(lengths)
        return lengths

    def _pad(self, x: torch.Tensor, time: bool = True) -> torch.Tensor:
        k, s = self.kernel_size, self.stride
        return F.pad(x, (k - 1, s - 1, k - 1, s - 1) if time else (k - 1, s - 1))

    def forward(self, feats: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
        x = zero_beyond(feats, lengths, 1).unsqueeze(1)
        x = self.conv_in(self._pad(x))
        if lengths is not None:
            lengths = self.stage_length(lengths)
        x = self.act(zero_beyond(x, lengths, 2))
        for stage in self.layers:
            x = stage(self._pad(x))
            if lengths is not None:
                lengths = self.stage_length(lengths)
            x = self.act(zero_beyond(x, lengths, 2))
        return self.project(x)

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, T', F') → (B, T', hidden): each frame's columns channel-major into ``linear``."""
        batch, channels, frames, freq = x.shape
        return self.linear(x.transpose(1, 2).reshape(batch, frames, channels * freq))


class _SubsamplingStage(nn.Module):
    def __init__(self, channels: int, kernel: int, stride: int):
        super().__init__()
        self.depthwise_conv = Conv2d(channels, channels, kernel, stride=stride, groups=channels)
        self.pointwise_conv = Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pointwise_conv(self.depthwise_conv(x))


class NemotronConvolution(FastConformerConvolution):
    """pointwise → GLU → padded frames zeroed → causal depthwise conv → LayerNorm → SiLU → pointwise."""

    def __init__(self, config):
        super().__init__(config)
        k = config.conv_kernel_size
        self.depthwise_conv = DepthwiseConv1d(config.hidden_size, k, padding=(k - 1, 0), bias=config.convolution_bias)
        self.norm = LayerNorm(config.hidden_size)


class AttentionLayout:
    """How one encoder pass groups queries and keys: ``blocks`` blocks of ``queries`` query frames, each scored
    against ``history`` keys before the block and its own ``queries`` frames, under the trained mask."""

    def __init__(self, frames: int, lengths: torch.Tensor, chunk: int, left_chunks: int, block: int,
                 dim: int, dtype: torch.dtype):
        device = lengths.device
        history = left_chunks * chunk
        queries = -(-block // chunk) * chunk
        if frames <= 2 * (queries + history):
            history, queries = 0, frames
        self.blocks, self.queries, self.history, self.frames = -(-frames // queries), queries, history, frames
        keys = history + queries
        # relative positions (query - key) from history + queries - 1 down to -(queries - 1)
        positions = torch.arange(keys - 1, -queries, -1, device=device)
        self.table = sinusoids(positions, dim, dtype)
        ar_q, ar_k = torch.arange(queries, device=device), torch.arange(keys, device=device)
        self.shift = (queries - 1 - ar_q[:, None] + ar_k[None, :])
        starts = torch.arange(self.blocks, device=device) * queries
        q_abs = starts[:, None] + ar_q[None, :]                       # (n, Q)
        k_abs = starts[:, None] - history + ar_k[None, :]             # (n, K)
        diff = q_abs[:, :, None] // chunk - k_abs[:, None, :].div(chunk, rounding_mode="floor")
        allowed = (diff >= 0) & (diff <= left_chunks) & (k_abs[:, None, :] >= 0)
        valid = k_abs[None, :, None, :] < lengths[:, None, None, None]  # (B, n, 1, K)
        self.mask = (allowed[None] & valid).reshape(-1, 1, queries, keys)  # (B·n, 1, Q, K)

    def split_queries(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H, T, d) → (B·n, H, Q, d)."""
        b, h, t, d = x.shape
        x = F.pad(x, (0, 0, 0, self.blocks * self.queries - t))
        return x.view(b, h, self.blocks, self.queries, d).transpose(1, 2).reshape(-1, h, self.queries, d)

    def split_keys(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H, T, d) → (B·n, H, history + Q, d): each block's keys (overlapping when history > 0)."""
        b, h, t, d = x.shape
        x = F.pad(x, (0, 0, self.history, self.blocks * self.queries - t))
        x = x.unfold(2, self.history + self.queries, self.queries)    # (B, H, n, d, K)
        return x.permute(0, 2, 1, 4, 3).reshape(-1, h, self.history + self.queries, d)

    def merge(self, out: torch.Tensor, batch: int) -> torch.Tensor:
        """(B·n, H, Q, d) → (B, H, T, d)."""
        _, h, q, d = out.shape
        out = out.view(batch, self.blocks, h, q, d).transpose(1, 2).reshape(batch, h, self.blocks * q, d)
        return out[:, :, :self.frames]


class ChunkedRelPositionAttention(RelPositionAttention):
    """Transformer-XL relative-position attention under the trained ``chunked_limited`` mask."""

    def scores_and_attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, table: torch.Tensor,
                          shift: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """q (N, H, Q, d), k / v (N, H, K, d), table (P, D) of relative positions, shift (Q, K) column of each
        (query, key) pair, mask (N, 1, Q, K) → (N, H, Q, d)."""
        bd = self.position_scores(q, self.position_keys(table), shift)
        return attend(q + self.bias_u[None, :, None, :], k, v, mask=mask, bias=bd, scale=self.head_dim ** -0.5)

    def forward(self, x: torch.Tensor, layout: AttentionLayout, residual: torch.Tensor | None = None) -> torch.Tensor:
        """``residual + o_proj(attention)`` (``residual`` None: 0)."""
        q, k, v = self.project(x, 0), self.project(x, 1), self.project(x, 2)
        out = self.scores_and_attend(layout.split_queries(q), layout.split_keys(k), layout.split_keys(v),
                                     layout.table, layout.shift, layout.mask)
        out = merge_heads(layout.merge(out, x.shape[0]))
        return self.o_proj(out) if residual is None else gemm_add(self.o_proj, out, residual)


class NemotronBlock(FastConformerBlock):
    def __init__(self, config):
        super().__init__(config)
        self.self_attn = ChunkedRelPositionAttention(config)
        self.conv = NemotronConvolution(config)

    def forward(self, x: torch.Tensor, layout: AttentionLayout, lengths: torch.Tensor | None) -> torch.Tensor:
        x = macaron(self.feed_forward1, self.norm_feed_forward1(x), x)
        x = self.self_attn(self.norm_self_att(x), layout, residual=x)
        x = self.conv(self.norm_conv(x), lengths, residual=x)
        x = macaron(self.feed_forward2, self.norm_feed_forward2(x), x)
        return self.norm_out(x)


class NemotronEncoder(NemotronStreamingMixin, BaseEncoder):
    """Log-mel (B, T, n_mels) → hidden (B, T', hidden_size) under the trained chunked_limited mask; cache-aware
    streaming on the ``slot`` backend (:mod:`oasr_models_hf.fastconformer.nemotron_streaming`)."""

    #: queries per offline attention block (rounded up to whole chunks)
    offline_block_frames: int = OFFLINE_BLOCK_FRAMES

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.subsampling_rate = config.subsampling_factor
        self.input_scale = math.sqrt(config.hidden_size) if config.scale_input else 1.0
        self.subsampling = NemotronSubsampling(config)
        self.layers = nn.ModuleList(NemotronBlock(config) for _ in range(config.num_hidden_layers))
        pack_gemms(self)  # prepacked oneDNN GEMMs on CPU inference (see oasr_models_hf.fastconformer.encoder)

    @property
    def output_size(self) -> int:
        return self.config.hidden_size

    @property
    def attention_chunk(self) -> int:
        """Frames per trained attention chunk (``num_lookahead_tokens + 1``)."""
        return self.config.num_lookahead_tokens + 1

    @property
    def left_chunks(self) -> int:
        return (self.config.sliding_window - 1) // self.attention_chunk

    def forward(self, feats: torch.Tensor, feat_lens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        batch, frames = feats.shape[:2]
        if feat_lens is None:
            feat_lens = torch.full((batch,), frames, dtype=torch.long, device=feats.device)
        feat_lens = feat_lens.to(feats.device).long()
        lengths = self.subsampling.output_lengths(feat_lens)
        x = self.subsampling(feats, feat_lens) * self.input_scale
        t = x.shape[1]
        lengths = lengths.clamp(max=t)
        layout = AttentionLayout(t, lengths, self.attention_chunk, self.left_chunks, self.offline_block_frames,
                                 self.config.hidden_size, x.dtype)
        conv_lengths = lengths if bool((lengths < t).any()) else None
        for layer in self.layers:
            x = layer(x, layout, conv_lengths)
        return x, lengths


__all__ = ["NemotronEncoder", "sinusoids"]
