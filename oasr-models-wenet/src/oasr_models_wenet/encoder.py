"""The WeNet Conformer encoder, offline and chunk-streaming, built from :mod:`oasr.layers`.

Graph (WeNet's ``ConformerEncoder`` with ``normalize_before``): global CMVN → conv2d subsampling
(÷4/6/8) scaled by √d → blocks of [½ macaron FFN, rel-pos self-attention, convolution module, ½ FFN,
block norm] → final norm.  Module attribute names follow WeNet's state-dict keys.

WeNet's relative-position attention has no ``rel_shift``: the positional term is ``(q + pos_bias_v) ·
linear_pos(pe[p_j])`` where ``p_j`` is the *absolute* frame index of key ``j``.  So each key carries
its own position and a chunk only needs the positions of its keys — which is what lets one batched
chunk forward serve streams at different offsets with different cache lengths.  The two score terms
are one dot product over concatenated head dimensions, ``[q + u, q + v] · [k, p]``, scaled by
``1/√d_k``, on the waist's SDPA core.

Streaming state (see :meth:`ConformerEncoder.forward_chunk`) is plain tensors:

* attention: per layer the chunk's keys and values, ``(B, H, T, d_k)`` each; the caller keeps them
  and passes them back, left-aligned, with each row's valid length;
* convolution (causal checkpoints only): per layer the last ``kernel - 1`` *post-GLU* frames,
  ``(B, kernel - 1, conv_channels)``.  A row at offset 0 starts from the module's response to
  silence (WeNet left-pads the module input with zeros), whatever its cache holds, so a zero-filled
  slot is a valid initial state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs
import torch
from torch import nn
from torch.nn.utils.rnn import pad_sequence

from oasr import layers
from oasr.errors import CapabilityError
from oasr.layers import packed
from oasr.layers.attention import merge_heads, split_heads
from oasr.models import BaseEncoder, CacheSpec, StreamingGeometry
from oasr.models.streaming import KV, ChunkOutput
from oasr_models_wenet import cpu
from oasr_models_wenet.config import SUBSAMPLING, ConformerEncoderConfig

#: rows of WeNet's positional table built at construction; it grows on demand past this
POSITION_TABLE_ROWS = 5000
#: CPU subsampling runs over tiles of (batch rows × output frames) ≈ this many, so its d-channel
#: intermediate stays in cache: measured ≈ 60 ms per 10 s row instead of 90–115 ms at batch 1, 8 and 32
#: (d = 256, one thread), with bit-identical output
CPU_TILE_ROWS = 64


class GlobalCmvn(nn.Module):
    """``(x - mean) * istd`` with WeNet's buffer names."""

    def __init__(self, dim: int):
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("istd", torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) * self.istd


class PositionTable(nn.Module):
    """WeNet's sinusoid table (sin on even, cos on odd columns), a computed buffer grown on demand."""

    def __init__(self, dim: int, rows: int = POSITION_TABLE_ROWS):
        super().__init__()
        self.dim = dim
        self.register_buffer("pe", layers.sinusoid_table(rows, dim), persistent=False)

    def _ensure(self, rows: int) -> None:
        if rows > self.pe.size(0):
            size = max(rows, 2 * self.pe.size(0))
            self.pe = layers.sinusoid_table(size, self.dim).to(device=self.pe.device, dtype=self.pe.dtype)

    def rows(self, start: int, length: int) -> torch.Tensor:
        """(1, length, dim): positions start .. start + length - 1."""
        self._ensure(start + length)
        return self.pe[start:start + length].unsqueeze(0)


class Conv2dSubsampling(nn.Module):
    """WeNet's ``Conv2dSubsampling{4,6,8}``: stride-2/3 Conv2d + ReLU stages, then a linear.

    ``conv`` keeps WeNet's ``nn.Sequential`` indices (``conv.0``, ``conv.2``, ...); the output
    linear is ``out`` (WeNet's ``out.0`` / ``linear``, renamed at load).
    """

    def __init__(self, input_dim: int, d_model: int, kind: str):
        super().__init__()
        self.subsampling_rate, self.right_context, self.stages = SUBSAMPLING[kind]
        modules: list[nn.Module] = []
        channels, freq = 1, input_dim
        self.conv_inputs: list[tuple[int, int]] = []  # (channels, frequency bins) each conv sees
        for kernel, stride in self.stages:
            self.conv_inputs.append((channels, freq))
            modules += [layers.Conv2d(channels, d_model, kernel, stride=stride), layers.Relu()]
            channels, freq = d_model, (freq - kernel) // stride + 1
        self.conv = nn.Sequential(*modules)
        self.out = layers.Linear(d_model * freq, d_model)
        self.xscale = math.sqrt(d_model)

    def output_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        for kernel, stride in self.stages:
            lengths = (lengths - kernel) // stride + 1
        return lengths.clamp(min=0)

    def _convolve(self, x: torch.Tensor) -> torch.Tensor:
        """The conv stack over (B, 1, T, F); on CPU in time tiles of about ``CPU_TILE_ROWS / B`` output
        frames, each tile reading exactly the input frames its outputs see (same result, in cache)."""
        rows = x.size(0)
        if x.device.type != "cpu" or rows >= CPU_TILE_ROWS:
            return self.conv(x)
        tile = CPU_TILE_ROWS // rows
        frames = int(self.output_lengths(torch.tensor(x.size(2))))
        if frames <= tile:
            return self.conv(x)
        rate, span = self.subsampling_rate, self.right_context + 1
        return torch.cat([self.conv(x[:, :, a * rate:a * rate + rate * (min(tile, frames - a) - 1) + span])
                          for a in range(0, frames, tile)], dim=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, F) → (B, T', d), already multiplied by √d (WeNet's RelPositionalEncoding)."""
        if cpu.subsampling_fusable(self, x):
            return cpu.subsampling_forward(self, x)
        x = self._convolve(x.unsqueeze(1))
        b, c, t, f = x.shape
        return packed.blocked(lambda rows: packed.linear(self.out, rows, scale=self.xscale),
                              x.transpose(1, 2).reshape(b, t, c * f))


def _scores_softmax_values(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                           key_lengths: torch.Tensor | None) -> torch.Tensor:
    """softmax(q·kᵀ·scale, padded keys hidden)·v with the score matrix masked and normalized in place
    (CPU inference; every row must have a valid key).  Measured 1.7x faster than SDPA's math path
    (which this head-dim mismatch, 2·d_k for q/k against d_k for v, selects) at 8 x 4 heads x 300
    frames, one thread; ``q`` is scaled in place."""
    scores = torch.matmul(q.mul_(scale), k.transpose(-2, -1))
    if key_lengths is not None:
        keys = k.size(-2)
        for row, n in enumerate(key_lengths.tolist()):  # only each row's padded key columns are touched
            if n < keys:
                scores[row, :, :, n:] = float("-inf")
    torch._softmax(scores, -1, False, out=scores)
    return torch.matmul(scores, v)


class RelPositionSelfAttention(nn.Module):
    """WeNet's ``RelPositionMultiHeadedAttention`` (no rel_shift), returning this call's K/V."""

    def __init__(self, d_model: int, n_heads: int, *, query_bias: bool, key_bias: bool, value_bias: bool):
        super().__init__()
        self.n_heads, self.d_k = n_heads, d_model // n_heads
        self.linear_q = layers.Linear(d_model, d_model, bias=query_bias)
        self.linear_k = layers.Linear(d_model, d_model, bias=key_bias)
        self.linear_v = layers.Linear(d_model, d_model, bias=value_bias)
        self.linear_out = layers.Linear(d_model, d_model, bias=query_bias)
        self.linear_pos = layers.Linear(d_model, d_model, bias=False)
        self.pos_bias_u = nn.Parameter(torch.zeros(n_heads, self.d_k))
        self.pos_bias_v = nn.Parameter(torch.zeros(n_heads, self.d_k))
        self.core = layers.Attention(n_heads, self.d_k)

    def forward(self, x: torch.Tensor, pos_emb: torch.Tensor, *, pos_index: torch.Tensor | None = None,
                past: KV | None = None, mask: torch.Tensor | None = None,
                key_lengths: torch.Tensor | None = None,
                residual: torch.Tensor | None = None) -> tuple[torch.Tensor, KV]:
        """``x`` (B, T, d) → (B, T, d) (plus ``residual`` when given) and the (k, v) of these T frames,
        (B, H, T, d_k) each.

        ``pos_emb`` holds table rows for the keys (``past`` then ``x``): (1 | B, Tk, d), or with
        ``pos_index`` (B, Tk) rows of a (1, R, d) table to pick per key.  ``mask`` (bool, True =
        visible) broadcasts to (B, H, T, Tk); ``key_lengths`` masks padded keys.
        """
        h = self.n_heads
        group = (self.linear_q, self.linear_k, self.linear_v)
        if packed.fusable(group, x):  # one GEMM over [W_q; W_k; W_v]
            qkv = packed.blocked(lambda rows: packed.linear_group(group, rows), x)
            q, k, v = (split_heads(y, h) for y in qkv.split([m.out_features for m in group], dim=-1))
        else:
            q, k, v = (split_heads(m(x), h) for m in group)
        new = (k, v)
        if past is not None:
            k = torch.cat([past[0], k], dim=2)
            v = torch.cat([past[1], v], dim=2)
        p = packed.blocked(lambda rows: packed.linear(self.linear_pos, rows), pos_emb)
        if pos_index is not None:
            p = p[0][pos_index]
        p = split_heads(p, h).expand(x.size(0), -1, -1, -1)
        qq = torch.cat([q + self.pos_bias_u.unsqueeze(1), q + self.pos_bias_v.unsqueeze(1)], dim=-1)
        kk = torch.cat([k, p], dim=-1)
        if mask is None and packed.fusable((), qq) and (key_lengths is None or bool((key_lengths > 0).all())):
            out = _scores_softmax_values(qq, kk, v, self.core.scale, key_lengths)
        else:
            out = self.core(qq, kk, v, mask=mask, key_lengths=key_lengths)
        if residual is None:
            return self.linear_out(merge_heads(out)), new
        return packed.blocked(lambda rows, res: packed.linear_add(self.linear_out, rows, res),
                              merge_heads(out), residual), new


class ConvolutionModule(nn.Module):
    """WeNet's Conformer convolution module: pointwise → GLU → depthwise → norm → act → pointwise.

    A causal module (``lorder = kernel - 1``) sees, left of the first frame, its response to a
    zero input (WeNet pads the module input with zeros), and carries its post-GLU tail between
    chunks.  Padded frames (``valid`` False) are zeroed after the GLU, so a padded batch row computes
    what the row computes alone.
    """

    def __init__(self, channels: int, kernel_size: int, activation: str, norm: str, causal: bool,
                 bias: bool, norm_eps: float, inner_factor: int):
        super().__init__()
        inner = inner_factor * channels // 2
        self.pointwise_conv1 = layers.PointwiseConv1d(channels, 2 * inner, bias=bias)
        self.glu = layers.Glu(dim=-1)
        self.lorder = kernel_size - 1 if causal else 0
        padding = (0, 0) if causal else ((kernel_size - 1) // 2, (kernel_size - 1) // 2)
        self.depthwise_conv = layers.DepthwiseConv1d(inner, kernel_size, padding=padding, bias=bias)
        self.norm = layers.BatchNorm1d(inner, eps=norm_eps) if norm == "batch_norm" else layers.LayerNorm(inner, norm_eps)
        self.activation = layers.Activation(activation)
        self.pointwise_conv2 = layers.PointwiseConv1d(inner, channels, bias=bias)

    def silence_response(self, batch: int, dtype: torch.dtype) -> torch.Tensor:
        """(batch, lorder, inner): the post-GLU frames left of the first input frame."""
        bias = self.pointwise_conv1.bias
        inner = self.depthwise_conv.in_channels
        if bias is None:
            frame = torch.zeros(inner, device=self.depthwise_conv.weight.device, dtype=dtype)
        else:
            frame = self.glu(bias.to(dtype))
        return frame.expand(batch, self.lorder, inner)

    def forward(self, x: torch.Tensor, *, valid: torch.Tensor | None = None, cache: torch.Tensor | None = None,
                fresh: torch.Tensor | None = None,
                lengths: torch.Tensor | None = None,
                residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``x`` (B, T, C) → (B, T, C) (plus ``residual`` when given) and, when causal, the new tail
        (B, lorder, inner).

        ``cache``: the previous tail (None: every row starts here); ``fresh`` (B,) rows that start
        here regardless of ``cache``; ``lengths`` (B,) valid frames (the tail ends at each row's last
        valid frame; default all T).
        """
        y = packed.blocked(lambda rows: packed.glu_linear(self.pointwise_conv1, rows), x)
        if valid is not None:
            if torch.is_grad_enabled():
                y = y.masked_fill(~valid.unsqueeze(-1), 0.0)
            else:  # y is this call's own output
                y.masked_fill_(~valid.unsqueeze(-1), 0.0)
        tail = None
        if self.lorder:
            start = self.silence_response(x.size(0), y.dtype)
            if cache is None:
                left = start
            elif fresh is None:
                left = cache.to(y.dtype)
            else:
                left = torch.where(fresh.view(-1, 1, 1), start, cache.to(y.dtype))
            y = torch.cat([left, y], dim=1)
            if lengths is None:
                tail = y[:, -self.lorder:]
            else:
                index = lengths.view(-1, 1) + torch.arange(self.lorder, device=y.device)
                tail = torch.gather(y, 1, index.unsqueeze(-1).expand(-1, -1, y.size(-1)))
        y = cpu.depthwise_norm_activation(self, y)
        if residual is None:
            return self.pointwise_conv2(y), tail
        return packed.blocked(lambda rows, res: packed.linear_add(self.pointwise_conv2, rows, res), y, residual), tail


class ConformerLayer(nn.Module):
    """WeNet's ``ConformerEncoderLayer`` (pre-norm)."""

    def __init__(self, cfg: ConformerEncoderConfig):
        super().__init__()
        d = cfg.output_size

        def ffn() -> layers.FeedForward:
            return layers.FeedForward(d, cfg.linear_units, cfg.activation_type, names=("w_1", "w_2"),
                                      bias=cfg.mlp_bias)

        self.self_attn = RelPositionSelfAttention(d, cfg.attention_heads, query_bias=cfg.query_bias,
                                                  key_bias=cfg.key_bias, value_bias=cfg.value_bias)
        self.feed_forward = ffn()
        self.feed_forward_macaron = ffn() if cfg.macaron_style else None
        self.conv_module = ConvolutionModule(
            d, cfg.cnn_module_kernel, cfg.activation_type, cfg.cnn_module_norm, cfg.causal, cfg.conv_bias,
            cfg.conv_norm_eps, cfg.conv_inner_factor) if cfg.use_cnn_module else None
        self.norm_ff = layers.LayerNorm(d, cfg.norm_eps)
        self.norm_mha = layers.LayerNorm(d, cfg.norm_eps)
        self.norm_ff_macaron = layers.LayerNorm(d, cfg.norm_eps) if cfg.macaron_style else None
        self.ff_scale = 0.5 if cfg.macaron_style else 1.0
        if cfg.use_cnn_module:
            self.norm_conv = layers.LayerNorm(d, cfg.norm_eps)
            self.norm_final = layers.LayerNorm(d, cfg.norm_eps)

    def _feed_forward(self, ff: layers.FeedForward, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``residual + ff_scale * ff(x)``, the activation and the scaled residual add fused into the GEMMs,
        over row blocks (:func:`oasr_models_wenet.cpu.feed_forward_blocks`)."""
        w_1, w_2 = getattr(ff, ff.names[0]), getattr(ff, ff.names[1])

        def block(rows: torch.Tensor, res: torch.Tensor) -> torch.Tensor:
            return packed.linear_add(w_2, packed.linear(w_1, rows, w_1.activation), res, scale=self.ff_scale)

        return cpu.feed_forward_blocks(block, (w_1, w_2), x, residual)

    def forward(self, x: torch.Tensor, pos_emb: torch.Tensor, *, pos_index: torch.Tensor | None = None,
                past: KV | None = None, mask: torch.Tensor | None = None,
                key_lengths: torch.Tensor | None = None, valid: torch.Tensor | None = None,
                conv_cache: torch.Tensor | None = None, fresh: torch.Tensor | None = None,
                lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, KV, torch.Tensor | None]:
        if self.feed_forward_macaron is not None:
            x = self._feed_forward(self.feed_forward_macaron, self.norm_ff_macaron(x), x)
        x, kv = self.self_attn(self.norm_mha(x), pos_emb, pos_index=pos_index, past=past, mask=mask,
                               key_lengths=key_lengths, residual=x)
        tail = None
        if self.conv_module is not None:
            x, tail = self.conv_module(self.norm_conv(x), valid=valid, cache=conv_cache, fresh=fresh,
                                       lengths=lengths, residual=x)
        x = self._feed_forward(self.feed_forward, self.norm_ff(x), x)
        if self.conv_module is not None:
            x = self.norm_final(x)
        return x, kv, tail


def chunk_attention_mask(size: int, chunk_size: int, num_left_chunks: int = -1,
                         device: torch.device | None = None) -> torch.Tensor:
    """(size, size) bool: frame i sees its own chunk and ``num_left_chunks`` before it (all if < 0)."""
    idx = torch.arange(size, device=device)
    chunk = idx // chunk_size
    end = ((chunk + 1) * chunk_size).clamp(max=size)
    start = torch.zeros_like(idx) if num_left_chunks < 0 else ((chunk - num_left_chunks) * chunk_size).clamp(min=0)
    return (idx[None, :] >= start[:, None]) & (idx[None, :] < end[:, None])


@attrs.define
class StreamState:
    """Dense per-batch streaming state for :meth:`ConformerEncoder.forward_chunk_stateful`."""

    offsets: torch.Tensor
    kv: list[KV] | None = None
    cache_lens: torch.Tensor | None = None
    conv_cache: torch.Tensor | None = None


def append_kv(old: KV | None, old_lens: torch.Tensor | None, new: KV, new_lens: torch.Tensor,
              keep: int = -1) -> tuple[KV, torch.Tensor]:
    """Append each row's valid new frames to its valid cached ones, keeping the last ``keep``
    frames (all if < 0), left-aligned: (cache (k, v), lengths)."""
    if old is None or old[0].size(2) == 0:
        k_all, v_all = new
        t_old = 0
        old_lens = torch.zeros_like(new_lens)
    else:
        if old_lens is None:
            old_lens = torch.full_like(new_lens, old[0].size(2))
        k_all = torch.cat([old[0], new[0]], dim=2)
        v_all = torch.cat([old[1], new[1]], dim=2)
        t_old = old[0].size(2)
    total = old_lens + new_lens
    kept = total if keep < 0 else total.clamp(max=keep)
    width = int(kept.max()) if kept.numel() else 0
    i = torch.arange(width, device=total.device)
    src = (total - kept).view(-1, 1) + i
    index = torch.where(src < old_lens.view(-1, 1), src, src - old_lens.view(-1, 1) + t_old)
    index = index.clamp(max=k_all.size(2) - 1) if k_all.size(2) else index
    index = index.view(index.size(0), 1, width, 1).expand(-1, k_all.size(1), -1, k_all.size(3))
    return (torch.gather(k_all, 2, index), torch.gather(v_all, 2, index)), kept


class ConformerEncoder(BaseEncoder):
    """WeNet's U2/U2++ Conformer encoder."""

    def __init__(self, cfg: ConformerEncoderConfig):
        super().__init__()
        self.config = cfg
        d = cfg.output_size
        self.global_cmvn = GlobalCmvn(cfg.input_dim) if cfg.global_cmvn else None
        self.embed = Conv2dSubsampling(cfg.input_dim, d, cfg.input_layer)
        self.pos_enc = PositionTable(d)
        self.encoders = nn.ModuleList(ConformerLayer(cfg) for _ in range(cfg.num_blocks))
        self.after_norm = layers.LayerNorm(d, cfg.norm_eps)
        self.subsampling_rate = self.embed.subsampling_rate
        self.right_context = self.embed.right_context
        # Streaming is honest only for weights trained with chunk masks.
        self.streaming_kind = "paged" if cfg.use_dynamic_chunk else "none"

    # -- introspection ------------------------------------------------------------------------
    @property
    def output_size(self) -> int:
        return self.config.output_size

    @property
    def n_kv_head(self) -> int:
        return self.config.attention_heads

    @property
    def head_dim(self) -> int:
        return self.config.head_dim

    @property
    def conv_cache_frames(self) -> int:
        return self.config.cnn_module_kernel - 1 if (self.config.causal and self.config.use_cnn_module) else 0

    @property
    def cache_spec(self) -> CacheSpec | None:
        if self.streaming_kind == "none":
            return None
        frames = self.conv_cache_frames
        return CacheSpec(num_layers=self.config.num_blocks, n_kv_head=self.n_kv_head, head_dim=self.head_dim,
                         conv_channels=self.config.conv_channels if frames else 0, conv_cache_frames=frames)

    def streaming_geometry(self, chunk_size: int) -> StreamingGeometry:
        if self.streaming_kind == "none":
            raise CapabilityError(
                "this Conformer checkpoint was not trained with dynamic chunks (encoder_conf.use_dynamic_chunk "
                "is false), so it cannot stream; use offline service", capability="streaming")
        return super().streaming_geometry(chunk_size)

    # -- offline --------------------------------------------------------------------------------
    def _embed(self, feats: torch.Tensor, feat_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.global_cmvn is not None:
            feats = self.global_cmvn(feats)
        short = self.right_context + 1 - feats.size(1)
        if short > 0:  # too few frames for one output frame: pad so the convolutions can run
            feats = torch.nn.functional.pad(feats, (0, 0, 0, short))
        return self.embed(feats), self.embed.output_lengths(feat_lens)

    def forward(self, feats: torch.Tensor, feat_lens: torch.Tensor, *, chunk_size: int = -1,
                num_left_chunks: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T, F), (B,) → (B, T', D), (B,).

        ``chunk_size > 0`` applies WeNet's chunk attention mask (``num_left_chunks`` < 0: unlimited
        history), the masked-offline equivalent of decoding chunk by chunk.
        """
        x, lens = self._embed(feats, feat_lens)
        t = x.size(1)
        pos = self.pos_enc.rows(0, t).to(x.dtype)
        mask = None
        if chunk_size > 0:
            mask = chunk_attention_mask(t, chunk_size, num_left_chunks, x.device)[None, None]
        full = bool((lens >= t).all())
        valid = None if full else torch.arange(t, device=x.device)[None, :] < lens[:, None]
        key_lengths = None if full else lens
        for layer in self.encoders:
            x, _, _ = layer(x, pos, mask=mask, key_lengths=key_lengths, valid=valid)
        if self.config.final_norm:
            x = self.after_norm(x)
        return x, lens

    # -- streaming ------------------------------------------------------------------------------
    def _key_positions(self, offsets: torch.Tensor, cache_lens: torch.Tensor, t_cache: int, chunk: int,
                       dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Table rows for every key (cache then chunk): (pos_emb, pos_index)."""
        first = offsets - cache_lens
        if bool((first == first[0]).all()) and bool((cache_lens == t_cache).all()) and int(first[0]) >= 0:
            return self.pos_enc.rows(int(first[0]), t_cache + chunk).to(dtype), None
        j = torch.arange(t_cache + chunk, device=offsets.device)
        positions = torch.where(j < t_cache, first.view(-1, 1) + j, offsets.view(-1, 1) + (j - t_cache))
        positions = positions.clamp(min=0)
        lo, hi = int(positions.min()), int(positions.max())
        if hi - lo + 1 <= positions.numel():
            return self.pos_enc.rows(lo, hi - lo + 1).to(dtype), positions - lo
        self.pos_enc._ensure(hi + 1)
        return self.pos_enc.pe[positions].to(dtype), None

    def forward_chunk(self, feats: torch.Tensor, offsets: torch.Tensor | int,
                      kv_cache: Sequence[KV] | None = None, conv_cache: torch.Tensor | None = None, *,
                      cache_lens: torch.Tensor | None = None,
                      feat_lens: torch.Tensor | None = None) -> ChunkOutput:
        """One chunk for B streams: WeNet's ``forward_chunk``, batched, with per-row state.

        ``feats`` (B, T_win, F): each row's feature window (``streaming_geometry(chunk).window_frames``,
        shorter rows padded, ``feat_lens`` their valid frames); ``offsets`` (B,) encoder frames each
        stream has already produced (its first frame's absolute position).  ``kv_cache`` per layer
        (k, v), (B, H, T_cache, d_k) each, left-aligned with ``cache_lens`` (B,) valid frames per row
        (default all); None for no history.  ``conv_cache`` (layers, B, conv_cache_frames,
        conv_channels), ignored for rows at offset 0; None when nobody has history.

        Every valid key (cached and new) is visible to every query of the chunk, as in WeNet; the
        caller decides how much history to keep (WeNet keeps ``chunk_size * num_left_chunks``).
        """
        b = feats.size(0)
        device = feats.device
        offsets = torch.as_tensor(offsets, device=device, dtype=torch.long).expand(b)
        if feat_lens is None:
            feat_lens = torch.full((b,), feats.size(1), device=device, dtype=torch.long)
        x, lens = self._embed(feats, feat_lens)
        chunk = x.size(1)
        t_cache = kv_cache[0][0].size(2) if kv_cache else 0
        if cache_lens is None:
            cache_lens = torch.full((b,), t_cache, device=device, dtype=torch.long)
        pos, pos_index = self._key_positions(offsets, cache_lens, t_cache, chunk, x.dtype)
        j = torch.arange(t_cache + chunk, device=device)
        key_valid = torch.where(j < t_cache, j < cache_lens.view(-1, 1), (j - t_cache) < lens.view(-1, 1))
        mask = None if bool(key_valid.all()) else key_valid[:, None, None, :]
        ragged = not bool((lens >= chunk).all())
        valid = torch.arange(chunk, device=device)[None, :] < lens[:, None] if ragged else None
        fresh = offsets == 0
        new_kv: list[KV] = []
        tails: list[torch.Tensor] = []
        for i, layer in enumerate(self.encoders):
            x, kv, tail = layer(
                x, pos, pos_index=pos_index, past=kv_cache[i] if kv_cache else None, mask=mask, valid=valid,
                conv_cache=conv_cache[i] if conv_cache is not None else None, fresh=fresh,
                lengths=lens if ragged else None)
            new_kv.append(kv)
            if tail is not None:
                tails.append(tail)
        if self.config.final_norm:
            x = self.after_norm(x)
        return ChunkOutput(hidden=x, lengths=lens, kv=new_kv, conv_cache=torch.stack(tails) if tails else None)

    def init_stream_state(self, batch_size: int, device: torch.device | str = "cpu") -> StreamState:
        return StreamState(offsets=torch.zeros(batch_size, dtype=torch.long, device=device))

    def forward_chunk_stateful(self, feats: torch.Tensor, state: StreamState, *,
                               feat_lens: torch.Tensor | None = None,
                               required_cache_size: int = -1) -> tuple[torch.Tensor, torch.Tensor, StreamState]:
        """:meth:`forward_chunk` with dense state kept here (the "stateful" parity oracle).

        ``required_cache_size`` is WeNet's: the attention history kept for the next chunk
        (``chunk_size * num_left_chunks``; < 0 keeps everything).
        """
        out = self.forward_chunk(feats, state.offsets, state.kv, state.conv_cache, cache_lens=state.cache_lens,
                                 feat_lens=feat_lens)
        kv: list[KV] = []
        kept = out.lengths
        for i, new in enumerate(out.kv):
            old = state.kv[i] if state.kv else None
            layer_kv, kept = append_kv(old, state.cache_lens, new, out.lengths, required_cache_size)
            kv.append(layer_kv)
        conv = out.conv_cache
        if conv is not None and state.conv_cache is not None:
            # a row that produced nothing keeps its tail (and stays fresh while its offset is 0)
            idle = (out.lengths == 0).view(1, -1, 1, 1)
            conv = torch.where(idle, state.conv_cache, conv)
        new_state = StreamState(offsets=state.offsets + out.lengths, kv=kv, cache_lens=kept, conv_cache=conv)
        return out.hidden, out.lengths, new_state

    def forward_chunk_by_chunk(self, feats: torch.Tensor, feat_lens: torch.Tensor, chunk_size: int,
                               num_left_chunks: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
        """WeNet's ``forward_chunk_by_chunk`` for a padded batch: windows of
        ``(chunk_size - 1) * rate + right_context + 1`` frames every ``chunk_size * rate`` frames."""
        geometry = self.streaming_geometry(chunk_size)
        context = self.right_context + 1
        required = chunk_size * num_left_chunks
        state = self.init_stream_state(feats.size(0), feats.device)
        outputs, lengths = [], []
        for cur in range(0, max(feats.size(1) - context + 1, 0), geometry.stride_frames):
            window = feats[:, cur:cur + geometry.window_frames]
            valid = (feat_lens - cur).clamp(min=0, max=window.size(1))
            hidden, lens, state = self.forward_chunk_stateful(window, state, feat_lens=valid,
                                                              required_cache_size=required)
            outputs.append(hidden)
            lengths.append(lens)
        if not outputs:
            return feats.new_zeros(feats.size(0), 0, self.output_size), torch.zeros_like(feat_lens)
        rows = [torch.cat([h[r, :int(n[r])] for h, n in zip(outputs, lengths, strict=True)]) for r in range(feats.size(0))]
        return pad_sequence(rows, batch_first=True), torch.stack(lengths, dim=1).sum(1)
