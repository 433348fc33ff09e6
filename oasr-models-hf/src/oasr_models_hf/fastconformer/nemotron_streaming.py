"""Cache-aware streaming of the Nemotron encoder on the ``slot`` backend (every per-stream tensor declared).

Why ``slot`` and not ``paged``: besides the attention K/V window and the conv tails, a stream carries the three
subsampling-stage tails, a feature delay line and (3.5) the prompt id, a persistent state; core's paged backend
holds K/V blocks and one conv tail per layer only, so all of it is declared as :class:`StreamStateSpec`:

- ``delay`` (S, factor - 1, n_mels): the encoder reads its features ``factor - 1`` frames late.  Offline, encoder
  frame ``t`` reads feature frames up to ``factor · t`` (causal subsampling), so frames ``0 .. c - 1`` need
  ``factor · (c - 1) + 1`` features and every later chunk ``factor · c`` more: delaying the stream by
  ``factor - 1`` zero frames (the causal left padding) makes every window ``factor · c`` frames.  The
  executor appends ``factor - 1`` zero frames at the end (``streaming_tail_frames``) to push the last real ones
  through;
- ``sub{j}`` (S, C_j, 1, F_j): the last input frame of subsampling stage ``j`` (kernel - stride = 1);
- ``kv`` (2, layers, S, heads, ring, d): a ring of keys and values, ``ring = history + chunk_size`` frames: the
  trained left context ``history = (sliding_window - 1) // chunk`` whole trained chunks (fixed by the checkpoint,
  whatever ``num_left_chunks`` says) and the chunk itself.  Absolute frame ``p`` lives in slot ``p mod ring``: a
  chunk writes its keys and values over the oldest slots in place and attends to the whole ring, each slot's
  mask and relative position those of the frame it holds (:class:`_RingAttention`), so no K/V frame is copied,
  shifted or concatenated per layer;
- ``conv`` (layers, S, kernel - 1, hidden): the causal depthwise convolution's input tail per layer;
- ``prompt`` (S,) int64, persistent (3.5 only): the stream's prompt id, written at admission from
  ``DecodingOptions.language`` and kept across a turn reset.

Frame positions are absolute per stream (``offsets``), so the trained ``chunked_limited`` mask, the relative
positions and each stage's zero padding (outputs at negative positions, or past the stream's end in its last
window, are zero) are exactly the offline ones.  Two geometry preconditions are checked by
:meth:`streaming_geometry`: ``chunk_size`` a whole number of trained chunks (``num_lookahead_tokens + 1``: the
mask groups absolute positions, a partial trained chunk would need keys from the future) and the feature
window a multiple of the subsampling factor (every stage's input a multiple of its stride).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional as F

from oasr.errors import CapabilityError
from oasr.layers import attend, merge_heads, packed
from oasr.models.base import StreamingGeometry
from oasr.models.specs import StreamStateSpec
from oasr_models_hf.fastconformer.encoder import gemm_add, macaron, zero_beyond


def _keep(x: torch.Tensor, start: torch.Tensor, end: torch.Tensor, axis: int) -> torch.Tensor:
    """``x`` with positions (absolute ``start[b] + i`` on ``axis``) outside ``[0, end[b])`` zeroed."""
    pos = start[:, None] + torch.arange(x.shape[axis], device=x.device)[None, :]
    keep = (pos >= 0) & (pos < end[:, None])
    shape = [1] * x.dim()
    shape[0], shape[axis] = keep.shape
    return x * keep.view(shape).to(x.dtype)


class NemotronStreamingMixin:
    """``forward_chunk_slots`` and the declared states of :class:`NemotronEncoder` (``streaming_kind = "slot"``)."""

    streaming_kind = "slot"
    right_context = 0
    streaming_pad_value = 0.0
    #: set by a prompted model: its prompt projector and default id, applied inside the chunk forward
    prompt_hook: tuple = ()

    @property
    def streaming_tail_frames(self) -> int:
        return self.config.subsampling_factor - 1

    @property
    def history_frames(self) -> int:
        return self.left_chunks * self.attention_chunk

    @property
    def ring_frames(self) -> int:
        """Frames of a stream's K/V ring: the trained history plus the chunk the engine streams at
        (:meth:`prepare_streaming`; before that, :attr:`default_chunk_size`)."""
        return self.history_frames + self.__dict__.get("_stream_chunk", self.default_chunk_size)

    def prepare_streaming(self, chunk_size: int, num_left_chunks: int) -> None:
        """Size the K/V ring for chunks of ``chunk_size`` (refused off the trained chunks) and, on the packed CPU
        path, run one chunk now: its first call packs every GEMM weight (~0.4 s for 110M parameters), which
        belongs to engine construction, not to the first stream's first chunk."""
        geometry = self.streaming_geometry(chunk_size)
        self._stream_chunk = chunk_size
        weight, window = self.layers[0].norm_out.weight, geometry.window_frames
        with torch.inference_mode():
            if packed.fusable((), weight.new_zeros(1, self.config.hidden_size), min_rows=1):
                states = {s.name: torch.full(s.shape, s.fill_value, dtype=getattr(torch, s.dtype),
                                             device=weight.device) for s in self.streaming_state_specs}
                self.forward_chunk_slots(weight.new_zeros(1, window, self.config.num_mel_bins),
                                         torch.tensor([window]), torch.zeros(1, dtype=torch.long), states)

    @property
    def streaming_state_specs(self) -> tuple[StreamStateSpec, ...]:
        c = self.config
        heads, d = c.num_attention_heads, c.head_dim
        specs = [StreamStateSpec("delay", (1, c.subsampling_factor - 1, c.num_mel_bins))]
        channels, freq = 1, c.num_mel_bins
        for j in range(len(self.subsampling.layers) + 1):
            specs.append(StreamStateSpec(f"sub{j}", (1, channels, 1, freq)))
            channels, freq = c.subsampling_conv_channels, self.subsampling.stage_length(freq)
        specs.append(StreamStateSpec("kv", (2, c.num_hidden_layers, 1, heads, self.ring_frames, d), slot_axis=2))
        specs.append(StreamStateSpec("conv", (c.num_hidden_layers, 1, c.conv_kernel_size - 1, c.hidden_size),
                                     slot_axis=1))
        if self.prompt_hook:
            specs.append(StreamStateSpec("prompt", (1,), dtype="int64", fill_value=float(self.prompt_hook[1]),
                                         persistent=True))
        return tuple(specs)

    def stream_request_state(self, options: Any) -> dict[str, torch.Tensor | float]:
        if not self.prompt_hook:
            return {}
        return {"prompt": float(self.prompt_hook[2](getattr(options, "language", None)))}

    @property
    def default_chunk_size(self) -> int:
        """One trained attention chunk (num_lookahead_tokens + 1 frames): the release's own latency."""
        return self.attention_chunk

    def streaming_geometry(self, chunk_size: int) -> StreamingGeometry:
        trained = self.attention_chunk
        if chunk_size <= 0 or chunk_size % trained:
            raise CapabilityError(
                f"chunk_size {chunk_size} is not a whole number of trained attention chunks: it must be a positive "
                f"multiple of num_lookahead_tokens + 1 = {trained} (the chunked_limited mask groups absolute "
                f"frame positions; a partial trained chunk would need keys from the future), e.g. "
                f"{max(trained, chunk_size // trained * trained)} or {(max(chunk_size, 0) // trained + 1) * trained}",
                capability="streaming")
        window = chunk_size * self.config.subsampling_factor
        if window % self.config.subsampling_factor:
            raise CapabilityError(f"the feature window {window} is not a multiple of the subsampling factor "
                                  f"{self.config.subsampling_factor}", capability="streaming")
        return StreamingGeometry(chunk_size, window, window)

    # -- the chunk step ----------------------------------------------------------------------------------------
    def _subsample_chunk(self, feats, feat_lens, offsets, states, ends):
        """Delayed window → (B, c, hidden) and the new delay / stage tails; ``ends`` (B,) the stream's true
        feature count where this is its last window, else a bound past the window."""
        sub, updated = self.subsampling, {}
        factor = self.config.subsampling_factor
        delay = states["delay"].to(feats.dtype)
        window = feats.shape[1]
        joined = torch.cat([delay, feats], dim=1)
        updated["delay"] = joined[:, window:]
        x = joined[:, :window].unsqueeze(1)                                    # (B, 1, W, F)
        start = offsets * factor - (factor - 1)                                # absolute first frame
        length = ends
        x = _keep(x, start, length, 2)
        stages = [sub.conv_in, *sub.layers]
        k, s = sub.kernel_size, sub.stride
        for j, stage in enumerate(stages):
            x = torch.cat([states[f"sub{j}"].to(x.dtype), x], dim=2)
            updated[f"sub{j}"] = x[:, :, -(k - s):]
            x = stage(F.pad(x, (k - 1, s - 1)))
            start, length = (start + 1) // s, sub.stage_length(length)
            x = sub.act(_keep(x, start, length, 2))
        return sub.project(x), updated

    def forward_chunk_slots(self, feats: torch.Tensor, feat_lens: torch.Tensor, offsets: torch.Tensor,
                            states: dict[str, torch.Tensor]):
        c = self.config
        factor, window = c.subsampling_factor, feats.shape[1]
        chunk = window // factor
        offsets = offsets.to(feats.device).long()
        feat_lens = feat_lens.to(feats.device).long()
        last = feat_lens < window
        start = offsets * factor - (factor - 1)
        ends = torch.where(last, start + feat_lens, start + window + factor)  # true feature count if last
        frames, updated = self._subsample_chunk(feats, feat_lens, offsets, states, ends)
        total = self.subsampling.output_lengths(ends)
        valid = torch.where(last, (total - offsets).clamp(0, chunk), torch.full_like(offsets, chunk))
        kv, conv = states["kv"], states["conv"]
        if kv.dtype != frames.dtype or conv.dtype != frames.dtype:
            kv, conv = kv.to(frames.dtype), conv.to(frames.dtype)
        ring = _RingAttention(self, offsets, valid, chunk, kv.shape[4])
        batch, rows = frames.shape[0], frames.shape[0] * chunk
        # row-wise work (norms, GEMMs with their residual adds) runs on (rows, hidden)
        x = frames.reshape(rows, -1).mul_(self.input_scale) if self.input_scale != 1.0 else frames.reshape(rows, -1)
        partial = bool(last.any())
        heads = (c.num_attention_heads, c.head_dim)
        for i, layer in enumerate(self.layers):
            x = macaron(layer.feed_forward1, layer.norm_feed_forward1(x), x)
            attn = layer.self_attn
            h = layer.norm_self_att(x)
            q, k, v = (m(h).view(batch, chunk, *heads) for m in (attn.q_proj, attn.k_proj, attn.v_proj))
            out = merge_heads(ring.attend(attn, q, k, v, kv[0, i], kv[1, i])).view(rows, -1)
            x = gemm_add(attn.o_proj, out, x)
            g = layer.conv.pointwise_glu(layer.norm_conv(x)).view(batch, chunk, -1)
            y = self._conv_chunk(layer.conv, g, conv[i], valid if partial else None)
            x = gemm_add(layer.conv.pointwise_conv2, y.reshape(rows, -1), x)
            x = macaron(layer.feed_forward2, layer.norm_feed_forward2(x), x)
            x = layer.norm_out(x)
        updated["kv"], updated["conv"] = kv, conv
        x = x.view(batch, chunk, -1)
        if self.prompt_hook:
            x = self.prompt_hook[0](x, states["prompt"].long())
        return x, valid, updated

    def _chunk_table(self, ring: int, chunk: int, like: torch.Tensor) -> torch.Tensor:
        """Sinusoids of the relative positions ``ring - 1 .. -(chunk - 1)``: every (query, key) pair of a chunk
        against its ring; one table per geometry, so each layer's projection of it is kept and reused."""
        from oasr_models_hf.fastconformer.nemotron_encoder import sinusoids

        key = (ring, chunk, like.dtype, like.device)
        tables = self.__dict__.setdefault("_chunk_tables", {})
        if key not in tables:
            tables[key] = sinusoids(torch.arange(ring - 1, -chunk, -1, device=like.device), self.config.hidden_size,
                                    like.dtype)
        return tables[key]

    @staticmethod
    def _conv_chunk(module, x, tail, valid):
        """The causal depthwise conv of (B, chunk, hidden) ``x`` after its cached ``k - 1`` input frames
        ``tail`` (updated in place); ``valid`` (B,) zeroes a last chunk's frames past its end (None: all whole)."""
        if valid is not None:
            x = zero_beyond(x, valid, 1)
        joined = torch.cat([tail, x], dim=1)
        tail.copy_(joined[:, -tail.shape[1]:])
        # the tail is the k - 1 frames of left context: no padding, len(x) outputs
        return packed.depthwise_norm_activation(module.depthwise_conv, module.norm, module.activation, joined, (0, 0))


class _RingAttention:
    """One chunk's attention against each stream's K/V ring, the same for every layer of the step.

    A stream's ring holds ``R >= history + chunk`` frames of keys and values; the frame at absolute position
    ``p`` lives in slot ``p mod R``.  A chunk writes its own keys and values over the oldest slots, then its
    queries attend to the whole ring: slot ``r`` holds position ``p(r)``, the one in ``[o + chunk - R, o +
    chunk)`` (``o`` the stream's offset), so the trained mask, the relative positions and the key validity are
    those of ``p(r)``; nothing is shifted or concatenated.  A query past a last chunk's end also sees its own
    key, so no row is without a key (its output is discarded; every valid query sees itself anyway)."""

    def __init__(self, encoder, offsets: torch.Tensor, valid: torch.Tensor, chunk: int, ring: int):
        hist, trained = encoder.history_frames, encoder.attention_chunk
        if ring < hist + chunk:
            raise ValueError(f"the K/V ring holds {ring} frames; chunks of {chunk} need {hist + chunk} "
                             f"(history {hist} + chunk): prepare_streaming({chunk}, ...) sizes it")
        device = offsets.device
        ar_q, ar_r = torch.arange(chunk, device=device), torch.arange(ring, device=device)
        base = offsets - hist - (ring - hist - chunk)                              # oldest position held
        pos = base[:, None] + (ar_r[None, :] - base[:, None]).remainder(ring)       # (B, R) position per slot
        q_abs = offsets[:, None] + ar_q[None, :]                                    # (B, Q)
        diff = q_abs[:, :, None].div(trained, rounding_mode="floor") - pos[:, None, :].div(trained,
                                                                                            rounding_mode="floor")
        allowed = ((diff >= 0) & (diff <= encoder.left_chunks) & (pos[:, None, :] >= 0)
                   & (pos[:, None, :] < (offsets + valid)[:, None, None])) | (pos[:, None, :] == q_abs[:, :, None])
        self.table = encoder._chunk_table(ring, chunk, encoder.layers[0].norm_out.weight)
        blocked = torch.zeros(allowed.shape, dtype=self.table.dtype, device=device)
        self.blocked = blocked.masked_fill_(~allowed, float("-inf"))[:, None]       # (B, 1, Q, R)
        # column of the table (relative position q - p, from R - 1 down) of each (query, slot) pair
        self.shift = (ring - 1 - ar_q[None, :, None] + (pos - offsets[:, None])[:, None, :])[:, None]
        self.slots = q_abs.remainder(ring)                                          # (B, Q) slots written
        self.chunk = chunk
        self.index = self.columns = None  # the two expanded per (B, H), made by the first layer

    def attend(self, attn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor,
               values: torch.Tensor) -> torch.Tensor:
        """This layer's (B, chunk, H, d) ``q``, ``k``, ``v`` and its (B, H, R, d) rings (written in place) →
        (B, H, chunk, d)."""
        q = q.transpose(1, 2)                                                       # (B, H, Q, d)
        b, h, _, d = q.shape
        if self.index is None:
            self.index = self.slots[:, None, :, None].expand(b, h, self.chunk, d)
            self.columns = self.shift.expand(b, h, -1, -1)
        keys.scatter_(2, self.index, k.transpose(1, 2))
        values.scatter_(2, self.index, v.transpose(1, 2))
        rel = attn.position_keys(self.table)                                        # (H, P, d)
        qv = (q + attn.bias_v.unsqueeze(1)).transpose(0, 1).reshape(h, b * self.chunk, d)
        bd = torch.bmm(qv, rel.transpose(1, 2)).view(h, b, self.chunk, -1).transpose(0, 1)
        bd = torch.gather(bd, -1, self.columns).mul_(attn.head_dim ** -0.5).add_(self.blocked)
        return attend(q + attn.bias_u.unsqueeze(1), keys, values, bias=bd, scale=attn.head_dim ** -0.5)


__all__ = ["NemotronStreamingMixin"]
