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
- ``kv`` (2, layers, S, heads, history, d): keys and values of the last ``history`` encoder frames, the trained
  left context ``(sliding_window - 1) // chunk`` whole trained chunks (``fixed`` by the checkpoint, whatever
  ``num_left_chunks`` says);
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
from oasr.layers import merge_heads, packed
from oasr.models.base import StreamingGeometry
from oasr.models.specs import StreamStateSpec
from oasr_models_hf.fastconformer.encoder import zero_beyond


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
    def streaming_state_specs(self) -> tuple[StreamStateSpec, ...]:
        c = self.config
        heads, d = c.num_attention_heads, c.head_dim
        specs = [StreamStateSpec("delay", (1, c.subsampling_factor - 1, c.num_mel_bins))]
        channels, freq = 1, c.num_mel_bins
        for j in range(len(self.subsampling.layers) + 1):
            specs.append(StreamStateSpec(f"sub{j}", (1, channels, 1, freq)))
            channels, freq = c.subsampling_conv_channels, self.subsampling.stage_length(freq)
        specs.append(StreamStateSpec("kv", (2, c.num_hidden_layers, 1, heads, self.history_frames, d), slot_axis=2))
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
        x, updated = self._subsample_chunk(feats, feat_lens, offsets, states, ends)
        x = x * self.input_scale
        total = self.subsampling.output_lengths(ends)
        valid = torch.where(last, (total - offsets).clamp(0, chunk), torch.full_like(offsets, chunk))
        hist = self.history_frames
        ar_q = torch.arange(chunk, device=x.device)
        ar_k = torch.arange(hist + chunk, device=x.device)
        q_abs = offsets[:, None] + ar_q[None, :]
        k_abs = offsets[:, None] - hist + ar_k[None, :]
        diff = q_abs[:, :, None] // self.attention_chunk - k_abs[:, None, :].div(self.attention_chunk,
                                                                                    rounding_mode="floor")
        mask = ((diff >= 0) & (diff <= self.left_chunks) & (k_abs[:, None, :] >= 0)
                & (k_abs[:, None, :] < (offsets + valid)[:, None, None]))[:, None]
        from oasr_models_hf.fastconformer.nemotron_encoder import sinusoids

        table = sinusoids(torch.arange(hist + chunk - 1, -chunk, -1, device=x.device), c.hidden_size, x.dtype)
        shift = chunk - 1 - ar_q[:, None] + ar_k[None, :]
        kv, conv = states["kv"].to(x.dtype), states["conv"].to(x.dtype)
        new_kv, new_conv = torch.empty_like(kv), torch.empty_like(conv)
        for i, layer in enumerate(self.layers):
            x = x + 0.5 * layer.feed_forward1(layer.norm_feed_forward1(x))
            attn = layer.self_attn
            h = layer.norm_self_att(x)
            q, k, v = attn.project(h, 0), attn.project(h, 1), attn.project(h, 2)
            k, v = torch.cat([kv[0, i], k], dim=2), torch.cat([kv[1, i], v], dim=2)
            new_kv[0, i], new_kv[1, i] = k[:, :, chunk:], v[:, :, chunk:]
            out = attn.scores_and_attend(q, k, v, table, shift, mask)
            x = x + attn.o_proj(merge_heads(out))
            x = x + self._conv_chunk(layer.conv, layer.norm_conv(x), conv[i], valid, new_conv, i)
            x = x + 0.5 * layer.feed_forward2(layer.norm_feed_forward2(x))
            x = layer.norm_out(x)
        updated["kv"], updated["conv"] = new_kv, new_conv
        if self.prompt_hook:
            x = self.prompt_hook[0](x, states["prompt"].long())
        return x, valid, updated

    @staticmethod
    def _conv_chunk(module, x, tail, valid, new_conv, layer: int):
        x = zero_beyond(module.pointwise_glu(x), valid, 1)
        joined = torch.cat([tail, x], dim=1)
        new_conv[layer] = joined[:, -tail.shape[1]:]
        # the tail is the k - 1 frames of left context: no padding, len(x) outputs
        y = packed.depthwise_norm_activation(module.depthwise_conv, module.norm, module.activation, joined, (0, 0))
        return module.pointwise_conv2(y)


__all__ = ["NemotronStreamingMixin"]
