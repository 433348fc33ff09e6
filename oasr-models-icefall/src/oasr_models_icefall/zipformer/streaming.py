"""Chunked streaming of a causal Zipformer2: icefall's ``streaming_forward`` of every module, run
over the offline modules' own parameters, and the engine faces built on it.

Geometry (icefall's ``streaming_decode.py``).  ``chunk_size`` is icefall's ``--chunk-size``: frames
at the embed rate (50 Hz, after ``encoder_embed``'s ÷2), so a chunk of 16 yields 8 encoder output
frames (the encoder halves the rate again).  Each step reads a window of ``2 * chunk + 13`` feature
frames at a stride of ``2 * chunk``: the embed turns T frames into ``(T - 7) // 2 - 3``, exactly one
chunk.  The left context (``--left-context-frames``, embed frames) is ``num_left_chunks * chunk``,
or the release's decode geometry (128 on icefall's streaming releases) when ``num_left_chunks < 0``.

End of stream.  icefall pads every utterance's features with 13 + 30 LOG_EPS frames and runs a
window while any padded frame is left, padding a short last window with LOG_EPS and counting it
whole.  The encoder declares that tail (``streaming_tail_frames``, ``streaming_pad_value``), the
executor appends it, and :func:`streaming_forward` refills every frame past a row's ``feat_lens``
with LOG_EPS and counts the window whole, so the chunks equal icefall's ``decode_one_chunk`` loop
over the stream alone.  (icefall's batched loop counts a short window's padding as invalid frames
when a longer window shares its batch; here a stream's chunks never depend on its cohort.)

State.  icefall's list (``get_init_states``): per layer ``cached_key``, ``cached_nonlin_attn``,
``cached_val1``, ``cached_val2``, ``cached_conv1``, ``cached_conv2``, then the embed's ConvNeXt left
pad and the processed-length counter, which masks the part of the left context still holding the
initial zeros.  The ``stateful`` face keeps that list per stream (the parity oracle); the ``slot``
face declares each tensor as a :class:`StreamStateSpec` on its icefall batch axis.
"""

from __future__ import annotations

import math
import warnings
import weakref
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from oasr.errors import CapabilityError
from oasr.layers.quant import is_quantized
from oasr.models import StreamingGeometry, StreamStateSpec
from oasr_models_icefall.release import LOG_EPS
from oasr_models_icefall.zipformer.scaling import convert_num_channels

#: the per-layer caches in icefall's order, with each one's batch axis
LAYER_CACHES = (("cached_key", 1), ("cached_nonlin_attn", 1), ("cached_val1", 1), ("cached_val2", 1),
                ("cached_conv1", 0), ("cached_conv2", 0))
#: feature frames icefall's DecodeStream pads after an utterance (``set_features(..., tail_pad_len=30)``)
TAIL_PAD_FRAMES = 30
#: icefall's DecodeStream.pad_length: 7 + 2 * 3 frames beyond 2 * chunk in every window
WINDOW_PAD_FRAMES = 13


# -- icefall's streaming_forward of each module ------------------------------------------------------
def attention_weights(mod, x, pos_emb, cached_key, left: int, key_padding_mask):
    """RelPositionMultiheadAttentionWeights: probabilities (H, B, T, left + T), the new key cache."""
    q, k, p = mod.project(x)
    k = torch.cat([cached_key, k], dim=0)
    scores = mod.scores(q, k, p, pos_emb)
    scores = scores.masked_fill(key_padding_mask.unsqueeze(1), -1000.0)
    return scores.softmax(dim=-1), k[-left:]


def nonlin_attention(mod, x, attn_weights, cached_x, left: int):
    """NonlinAttention over the cached gated inputs (1, B, left, hidden) of the first head."""
    seq_len, batch, _ = x.shape
    x, y = mod.gate(x)
    heads = attn_weights.shape[0]
    x = x.reshape(seq_len, batch, heads, -1).permute(2, 1, 0, 3)
    x_pad = torch.cat([cached_x, x], dim=2)
    x = torch.matmul(attn_weights, x_pad).permute(2, 1, 0, 3).reshape(seq_len, batch, -1)
    return mod.out_proj(x * y), x_pad[:, :, -left:]


def self_attention(mod, x, attn_weights, cached_val, left: int):
    """SelfAttention over the cached values (left, B, H * dv)."""
    seq_len, batch, _ = x.shape
    heads = attn_weights.shape[0]
    v = torch.cat([cached_val, mod.in_proj(x)], dim=0)
    out = torch.matmul(attn_weights, v.reshape(v.shape[0], batch, heads, -1).permute(2, 1, 0, 3))
    return mod.out_proj(out.permute(2, 1, 0, 3).reshape(seq_len, batch, -1)), v[-left:]


def convolution(mod, x, cache):
    """ConvolutionModule with ChunkCausalDepthwiseConv1d's streaming form: the causal half sees the
    cached ``kernel // 2`` frames, the chunkwise conv this chunk alone.  No padding mask: every frame
    of a chunk is valid (icefall's chunk part of the key padding mask is all False)."""
    x = mod.gate(x, None)  # (B, C, T)
    conv = mod.depthwise_conv
    pad = conv.kernel_size // 2
    x = torch.cat([cache, x], dim=2)
    x_causal = conv.causal_conv.forward_bct(x)
    x_chunk = conv.chunkwise_conv.forward_bct(x[..., pad:])
    x_chunk = x_chunk * conv.chunk_scale(x_chunk.shape[-1])
    return mod.out_proj((x_chunk + x_causal).permute(2, 0, 1)), x[..., -pad:]


def encoder_layer(layer, src, pos_emb, caches: list[torch.Tensor], left: int, key_padding_mask):
    """Zipformer2EncoderLayer.streaming_forward; ``caches`` are the layer's six, returned updated."""
    cached_key, cached_nonlin, cached_val1, cached_val2, cached_conv1, cached_conv2 = caches
    src_orig = src
    attn, cached_key = attention_weights(layer.self_attn_weights, src, pos_emb, cached_key, left, key_padding_mask)
    src = src + layer.feed_forward1(src)
    na, cached_nonlin = nonlin_attention(layer.nonlin_attention, src, attn[0:1], cached_nonlin, left)
    src = src + na
    sa, cached_val1 = self_attention(layer.self_attn1, src, attn, cached_val1, left)
    src = src + sa
    conv, cached_conv1 = convolution(layer.conv_module1, src, cached_conv1)
    src = src + conv
    src = src + layer.feed_forward2(src)
    src = layer.bypass_mid(src_orig, src)
    sa, cached_val2 = self_attention(layer.self_attn2, src, attn, cached_val2, left)
    src = src + sa
    conv, cached_conv2 = convolution(layer.conv_module2, src, cached_conv2)
    src = src + conv
    src = src + layer.feed_forward3(src)
    src = layer.bypass(src_orig, layer.norm(src))
    return src, [cached_key, cached_nonlin, cached_val1, cached_val2, cached_conv1, cached_conv2]


def encoder_stack(module, src, caches: list[torch.Tensor], left: int, key_padding_mask):
    """Zipformer2Encoder / DownsampledZipformer2Encoder.streaming_forward at the embed frame rate."""
    downsampled = hasattr(module, "downsample_factor")
    stack = module.encoder if downsampled else module
    src_orig = src
    if downsampled:
        src = module.downsample(src)
    pos_emb = stack.encoder_pos(src, left)
    new: list[torch.Tensor] = []
    for i, layer in enumerate(stack.layers):
        src, layer_caches = encoder_layer(layer, src, pos_emb, caches[6 * i: 6 * i + 6], left, key_padding_mask)
        new += layer_caches
    if downsampled:
        src = module.out_combiner(src_orig, module.upsample(src)[: src_orig.shape[0]])
    return src, new


def embed(encoder_embed, feats, cached_left_pad):
    """Conv2dSubsampling.streaming_forward: (B, T, F) → (B, (T - 7) // 2 - 3, D), the ConvNeXt's new
    left pad (its 3 frames of right context come from the window, not from padding)."""
    x = encoder_embed.conv(feats.unsqueeze(1))
    convnext = encoder_embed.convnext
    pad_t, pad_f = convnext.padding
    frames = x.shape[2] - pad_t
    bypass = x[:, :, :frames]
    x = torch.cat([cached_left_pad, x], dim=2)
    cached_left_pad = x[:, :, frames: frames + pad_t]
    dw = convnext.depthwise_conv
    x = F.conv2d(x, dw.weight, dw.bias, padding=(0, pad_f), groups=dw.groups)
    x = convnext.pointwise_conv2(convnext.activation(convnext.pointwise_conv1(x)))
    x = bypass + x
    b, c, t, f = x.shape
    x = encoder_embed.out_norm(encoder_embed.out(x.transpose(1, 2).reshape(b, t, c * f)))
    return x, cached_left_pad


def streaming_forward(encoder, feats: torch.Tensor, feat_lens: torch.Tensor, states: list[torch.Tensor],
                      left: int) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """One chunk of a cohort (icefall's ``streaming_forward`` of ``streaming_decode.py``).

    ``feats`` (B, 2 * chunk + 13, F): frames at or past a row's ``feat_lens`` become LOG_EPS and the
    window counts whole, as icefall pads a short last window.  ``states`` is icefall's list with the
    batch on each tensor's icefall axis; ``left`` the left context in embed frames.  Returns hidden
    (B, chunk // 2, D), lengths (B,) and the new list.
    """
    zipformer = encoder.encoder
    batch, frames, _ = feats.shape
    pad = torch.arange(frames, device=feats.device) >= feat_lens.view(-1, 1)
    feats = feats.masked_fill(pad.unsqueeze(-1), LOG_EPS)
    x, new_embed = embed(encoder.encoder_embed, feats, states[-2])
    chunk = x.shape[1]
    multiple = encoder._chunk_multiple()
    if chunk <= 0 or chunk % multiple:
        raise CapabilityError(f"a zipformer streaming window of {frames} feature frames gives {chunk} embed frames, "
                              f"not a positive multiple of {multiple}: windows are 2 * chunk_size + 13 frames",
                              capability="streaming")
    x_lens = torch.full((batch,), chunk, dtype=torch.long, device=feats.device)
    processed = states[-1]
    history = torch.arange(left, device=feats.device).expand(batch, left)
    processed_mask = (processed.view(-1, 1) <= history).flip(1)
    key_padding_mask = torch.cat([processed_mask, torch.zeros_like(processed_mask[:, :chunk])], dim=1)
    x = x.permute(1, 0, 2)
    outputs, new_states, offset = [], [], 0
    for i, module in enumerate(zipformer.encoders):
        ds = zipformer.downsampling_factor[i]
        count = 6 * module.num_layers
        x = convert_num_channels(x, zipformer.encoder_dim[i])
        x, caches = encoder_stack(module, x, states[offset: offset + count], left // ds, key_padding_mask[:, ::ds])
        offset += count
        outputs.append(x)
        new_states += caches
    x = zipformer.downsample_output(zipformer.get_full_dim_output(outputs))
    new_states += [new_embed, processed + x_lens.to(processed.dtype)]
    return x.permute(1, 0, 2), (x_lens + 1) // 2, new_states


class ChunkStep(nn.Module):
    """:func:`streaming_forward` at one window length and left context as a module over the encoder's
    own submodules (what :func:`torch.jit.trace` records: the parameters are shared, not copied)."""

    def __init__(self, encoder, left: int):
        super().__init__()
        self.encoder_embed, self.encoder = encoder.encoder_embed, encoder.encoder
        self.multiple, self.left = encoder._chunk_multiple(), left

    def _chunk_multiple(self) -> int:
        return self.multiple

    def forward(self, feats: torch.Tensor, feat_lens: torch.Tensor, *states: torch.Tensor):
        hidden, lengths, new = streaming_forward(self, feats, feat_lens, list(states), self.left)
        return (hidden, lengths, *new)


#: per encoder: (window frames, left, dtype) → its traced ChunkStep, or None where eager is used
_TRACED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def traced_step(encoder, feats: torch.Tensor, feat_lens: torch.Tensor, states: list[torch.Tensor], left: int):
    """The chunk step as a TorchScript trace (made on first use for this window length and left
    context), or None where the eager :func:`streaming_forward` runs: off CPU (CUDA has the engine's
    graph capture), with autograd on, in training, inside another trace/export, or on an int8 model.

    One chunk step is ~7,000 small aten calls; the trace drops their Python dispatch (1.2-1.4x per
    step on CPU) and computes the same values bit for bit.  Every shape the step reads is traced,
    so one trace serves every cohort size and every mix of ``feat_lens``.
    """
    if (not encoder.trace_chunk_step or feats.device.type != "cpu" or encoder.training
            or torch.is_grad_enabled() or torch.jit.is_tracing()):
        return None
    cache = _TRACED.setdefault(encoder, {})
    key = (feats.shape[1], left, feats.dtype)
    if key not in cache:
        cache[key] = None
        if not is_quantized(encoder):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", torch.jit.TracerWarning)
                warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.trace, still the CPU win here
                cache[key] = torch.jit.trace(ChunkStep(encoder, left).eval(), (feats, feat_lens, *states),
                                             check_trace=False)
    return cache[key]


def chunk_step(encoder, feats: torch.Tensor, feat_lens: torch.Tensor, states: list[torch.Tensor],
               left: int) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """:func:`streaming_forward`, through its trace where :func:`traced_step` gives one."""
    step = traced_step(encoder, feats, feat_lens, states, left)
    if step is None:
        return streaming_forward(encoder, feats, feat_lens, states, left)
    hidden, lengths, *new = step(feats, feat_lens, *states)
    return hidden, lengths, new


# -- the encoder's streaming faces ----------------------------------------------------------------------
class ZipformerStreaming:
    """Mixin of :class:`ZipformerEncoderModel`: ``slot`` streaming of a causal release (``stateful``
    through :meth:`init_stream_state` / :meth:`forward_chunk_stateful`, icefall's list API)."""

    streaming_pad_value = LOG_EPS
    #: run CPU chunk steps through a TorchScript trace of :func:`streaming_forward` (see :func:`traced_step`)
    trace_chunk_step = True

    @property
    def streaming_kind(self) -> str:
        """``slot`` for a causal release with a decode chunk, ``none`` otherwise (refused at
        streaming-engine construction)."""
        config = self.config
        return "slot" if config.causal and config.chunk_size > 0 else "none"

    @property
    def streaming_tail_frames(self) -> int:
        """icefall's 30 + 13 padding frames, plus ``right_context``: the executor runs a final window
        while more than ``right_context`` frames are left, icefall while any padded frame is."""
        return TAIL_PAD_FRAMES + WINDOW_PAD_FRAMES + self.right_context

    # geometry ------------------------------------------------------------------------------------------
    def _chunk_multiple(self) -> int:
        config = self.config
        return math.lcm(*config.downsampling_factor, config.output_downsampling_factor)

    def streaming_left_context(self, chunk_size: int, num_left_chunks: int) -> int:
        """Left context in embed frames: ``num_left_chunks * chunk_size``, or the release's decode
        geometry when ``num_left_chunks < 0``."""
        left = chunk_size * num_left_chunks if num_left_chunks >= 0 else self.config.left_context_frames
        multiple = self._chunk_multiple()
        if left <= 0 or left % multiple:
            raise CapabilityError(
                f"zipformer streaming needs a left context that is a positive multiple of {multiple} embed "
                f"frames, got {left} (chunk_size {chunk_size} x num_left_chunks {num_left_chunks}; -1: the "
                f"release's {self.config.left_context_frames})", capability="streaming")
        return left

    def prepare_streaming(self, chunk_size: int, num_left_chunks: int) -> None:
        """Size the per-stream caches for ``chunk_size`` (embed frames) and its left context."""
        self.streaming_geometry(chunk_size)
        self._stream_left = self.streaming_left_context(chunk_size, num_left_chunks)
        self.warm_chunk_step(chunk_size)

    def warm_chunk_step(self, chunk_size: int) -> None:
        """Make the chunk step's trace (:func:`traced_step`; seconds on a CPU) now, at streaming-engine
        construction, rather than inside a stream's first chunk."""
        device = next(self.parameters()).device
        frames = 2 * chunk_size + WINDOW_PAD_FRAMES
        feats = torch.zeros(1, frames, self.config.feature_dim, dtype=self._float_dtype(), device=device)
        with torch.no_grad():
            traced_step(self, feats, torch.tensor([frames], device=device), self.init_stream_state(1, device),
                        self.stream_left_context)

    def streaming_geometry(self, chunk_size: int) -> StreamingGeometry:
        multiple = self._chunk_multiple()
        if chunk_size <= 0 or chunk_size % multiple:
            raise CapabilityError(
                f"zipformer streaming needs chunk_size (embed frames, icefall's --chunk-size) to be a positive "
                f"multiple of {multiple} (the stacks' downsampling), got {chunk_size}", capability="streaming")
        stride = 2 * chunk_size
        return StreamingGeometry(chunk_size // self.config.output_downsampling_factor,
                                 stride + WINDOW_PAD_FRAMES, stride)

    @property
    def stream_left_context(self) -> int:
        """The left context (embed frames) the streaming state is sized for."""
        left = getattr(self, "_stream_left", None)
        return self.config.left_context_frames if left is None else left

    # state ---------------------------------------------------------------------------------------------
    def _cache_shapes(self, left: int) -> list[tuple[str, tuple[int, ...], int]]:
        """(name, shape with batch 1, batch axis) of every tensor of icefall's state list, in order."""
        config = self.config
        out = []
        layer = 0
        for i, ds in enumerate(config.downsampling_factor):
            dim, heads = config.encoder_dim[i], config.num_heads[i]
            lc = left // ds
            shapes = ((lc, 1, config.query_head_dim[i] * heads), (1, 1, lc, 3 * dim // 4),
                      (lc, 1, config.value_head_dim[i] * heads), (lc, 1, config.value_head_dim[i] * heads),
                      (1, dim, config.cnn_module_kernel[i] // 2), (1, dim, config.cnn_module_kernel[i] // 2))
            for _ in range(config.num_encoder_layers[i]):
                out += [(f"layer{layer}.{name}", shape, axis)
                        for (name, axis), shape in zip(LAYER_CACHES, shapes, strict=True)]
                layer += 1
        emb = self.encoder_embed
        out.append(("embed.cached_left_pad", (1, emb.layer3_channels, emb.convnext.padding[0], emb.out_width), 0))
        out.append(("processed_lens", (1,), 0))
        return out

    def _float_dtype(self) -> torch.dtype:
        return next(p.dtype for p in self.parameters() if p.is_floating_point())

    @property
    def streaming_state_specs(self) -> tuple[StreamStateSpec, ...]:
        """One spec per tensor of icefall's state list, on its icefall batch axis."""
        dtype = str(self._float_dtype()).removeprefix("torch.")
        return tuple(StreamStateSpec(name, shape, dtype="int64" if name == "processed_lens" else dtype,
                                     slot_axis=axis)
                     for name, shape, axis in self._cache_shapes(self.stream_left_context))

    def init_stream_state(self, batch_size: int, device: torch.device | str = "cpu") -> list[torch.Tensor]:
        """icefall's ``get_init_states``: zero caches for ``batch_size`` streams and the counter."""
        dtype = self._float_dtype()
        state = []
        for name, shape, axis in self._cache_shapes(self.stream_left_context):
            shape = list(shape)
            shape[axis] = batch_size
            state.append(torch.zeros(shape, dtype=torch.int64 if name == "processed_lens" else dtype, device=device))
        return state

    def stack_streaming_states(self, states: list[list[torch.Tensor]]) -> list[torch.Tensor]:
        """icefall's ``stack_states``: per-stream lists → one list of the streams as a batch."""
        axes = [axis for _, _, axis in self._cache_shapes(self.stream_left_context)]
        return [torch.cat(parts, dim=axis) for parts, axis in zip(zip(*states, strict=True), axes, strict=True)]

    def unstack_streaming_states(self, state: list[torch.Tensor]) -> list[list[torch.Tensor]]:
        """icefall's ``unstack_states``: the inverse of :meth:`stack_streaming_states`."""
        axes = [axis for _, _, axis in self._cache_shapes(self.stream_left_context)]
        batch = state[-1].shape[0]
        split = [t.chunk(batch, dim=axis) for t, axis in zip(state, axes, strict=True)]
        return [[parts[b] for parts in split] for b in range(batch)]

    # chunk steps ----------------------------------------------------------------------------------------
    def forward_chunk_stateful(self, feats: torch.Tensor, state: list[torch.Tensor], *,
                               feat_lens: torch.Tensor | None = None,
                               required_cache_size: int = -1) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """One chunk on icefall's state list; the left context is the one the state was made for
        (``required_cache_size`` is not consulted: the cache extents fix it)."""
        if feat_lens is None:
            feat_lens = torch.full((feats.shape[0],), feats.shape[1], dtype=torch.long, device=feats.device)
        left = state[0].shape[0] * self.config.downsampling_factor[0]
        return chunk_step(self, feats, feat_lens, state, left)

    def forward_chunk_slots(self, feats: torch.Tensor, feat_lens: torch.Tensor, offsets: Any,
                            states: dict[str, torch.Tensor]):
        """The same chunk with the state list read from and returned as the declared slot states."""
        names = [name for name, _, _ in self._cache_shapes(self.stream_left_context)]
        hidden, lengths, new = chunk_step(self, feats, feat_lens, [states[n] for n in names],
                                                 self.stream_left_context)
        return hidden, lengths, dict(zip(names, new, strict=True))
