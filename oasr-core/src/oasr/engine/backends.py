"""Streaming backends: one class per ``encoder.streaming_kind``, each owning its per-stream state.

Every backend allocates its pools at construction (nothing grows with the number of chunks or
streams) and has the same five operations: ``allocate`` a stream into its slot at admission,
``reset`` it at a turn boundary (what the encoder heard is forgotten, what the request asked is
kept), ``forward`` one chunk for a cohort of streams, ``release`` it at the end, and ``nbytes`` of
pool memory.  :data:`BACKENDS` is the table the executor picks from; the members each backend calls
on the encoder are the Protocols of :mod:`oasr.models.streaming`.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, ClassVar

import torch

from oasr.errors import CapabilityError
from oasr.models.specs import CacheSpec, StreamStateSpec
from oasr.models.streaming import STREAMING_PROTOCOLS, ChunkOutput


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


class StreamingBackend:
    """What the executor needs from a backend; subclasses are listed in :data:`BACKENDS`."""

    kind: ClassVar[str] = ""

    def __init__(self, model: Any, *, max_streams: int, chunk_size: int, num_left_chunks: int, max_chunks: int,
                 dtype: torch.dtype, device: torch.device, lock: threading.RLock):
        self.model = model
        self.encoder = model.encoder
        self.max_streams = max_streams
        self.chunk_size = chunk_size
        self.num_left_chunks = num_left_chunks
        self.max_chunks = max_chunks
        self.dtype = dtype
        self.device = device
        self.lock = lock
        protocol = STREAMING_PROTOCOLS[self.kind]
        if not isinstance(self.encoder, protocol):
            declared = [*getattr(protocol, "__annotations__", {}), *(n for n in vars(protocol) if not n.startswith("_"))]
            members = [m for m in declared if not hasattr(self.encoder, m)]
            raise CapabilityError(
                f"{type(self.encoder).__name__} declares streaming_kind={self.kind!r} but lacks "
                f"{', '.join(sorted(members))} ({protocol.__name__} in oasr.models.streaming)", capability="streaming",
                missing=tuple(sorted(members)))

    def allocate(self, stream: Any) -> None:
        """Prepare the state of ``stream`` (its ``slot`` is set) for its first chunk."""

    def reset(self, stream: Any) -> None:
        """Forget what the encoder heard on ``stream``; keep what describes its request."""
        self.release(stream)
        self.allocate(stream)

    def forward(self, streams: list[Any], feats: torch.Tensor, feat_lens: torch.Tensor,
                offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def release(self, stream: Any) -> None:
        """Return what ``stream`` holds to the pools."""

    def nbytes(self) -> int:
        return 0


class PagedKVPool:
    """Block pools of attention K/V for every layer plus slot tensors for the conv tails.

    ``k``/``v``: (layers, num_blocks, heads, block_size, head_dim); a block holds one chunk.
    """

    def __init__(self, spec: CacheSpec, *, max_streams: int, blocks_per_stream: int, block_size: int,
                 dtype: torch.dtype, device: torch.device):
        self.block_size = block_size
        self.blocks_per_stream = blocks_per_stream
        num_blocks = max_streams * blocks_per_stream
        shape = (spec.num_layers, num_blocks, spec.n_kv_head, block_size, spec.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.conv = None
        if spec.conv_cache_frames:
            self.conv = torch.zeros(spec.num_layers, max_streams, spec.conv_cache_frames, spec.conv_channels,
                                    dtype=dtype, device=device)
        self.free_blocks: deque[int] = deque(range(num_blocks))

    def nbytes(self) -> int:
        total = self.k.nbytes + self.v.nbytes
        return total + (self.conv.nbytes if self.conv is not None else 0)

    def allocate(self) -> int:
        return self.free_blocks.popleft()

    def release(self, blocks: list[int]) -> None:
        self.free_blocks.extend(blocks)
        blocks.clear()

    def gather(self, tables: list[list[int]]):
        """Dense (k, v) per layer for a cohort: (B, H, T_cache, d) left-aligned, and lengths (B,)."""
        width = max((len(t) for t in tables), default=0)
        if width == 0:
            return None, None
        index = torch.tensor([t + [t[-1] if t else 0] * (width - len(t)) for t in tables], device=self.k.device)
        lens = torch.tensor([len(t) * self.block_size for t in tables], device=self.k.device)
        layers, _, heads, bs, d = self.k.shape
        b = len(tables)

        def dense(pool: torch.Tensor) -> torch.Tensor:
            # (L, B, W, H, bs, d) → (L, B, H, W*bs, d)
            picked = pool[:, index]
            return picked.permute(0, 1, 3, 2, 4, 5).reshape(layers, b, heads, width * bs, d)

        k, v = dense(self.k), dense(self.v)
        return [(k[i], v[i]) for i in range(layers)], lens

    def write(self, block: int, layer_kv: list[tuple[torch.Tensor, torch.Tensor]], row: int) -> None:
        """Store one stream's chunk K/V (row ``row`` of each layer's (B, H, chunk, d)) in ``block``."""
        for layer, (k, v) in enumerate(layer_kv):
            self.k[layer, block] = k[row]
            self.v[layer, block] = v[row]


class PagedBackend(StreamingBackend):
    """Attention K/V in blocks of one chunk each, a block table per stream, left-chunk eviction."""

    kind = "paged"

    def __init__(self, model: Any, **kw: Any):
        super().__init__(model, **kw)
        spec = model.cache_spec
        if spec is None:
            raise CapabilityError(f"{type(model).__name__} declares a paged encoder but no cache_spec",
                                  capability="streaming")
        blocks = self.num_left_chunks if self.num_left_chunks >= 0 else self.max_chunks
        self.pool = PagedKVPool(spec, max_streams=self.max_streams, blocks_per_stream=max(blocks, 1),
                                block_size=self.chunk_size, dtype=self.dtype, device=self.device)

    def allocate(self, stream: Any) -> None:
        if self.pool.conv is not None:
            self.pool.conv[:, stream.slot].zero_()

    def release(self, stream: Any) -> None:
        self.pool.release(stream.blocks)

    def nbytes(self) -> int:
        return self.pool.nbytes()

    def forward(self, streams, feats, feat_lens, offsets):
        pool = self.pool
        kv_cache, cache_lens = pool.gather([s.blocks for s in streams])
        slots = torch.tensor([s.slot for s in streams], device=feats.device)
        conv = pool.conv[:, slots] if pool.conv is not None else None
        out = self.encoder.forward_chunk(feats, offsets, kv_cache, conv, cache_lens=cache_lens, feat_lens=feat_lens)
        with self.lock:
            self._store(streams, out, slots)
        return out.hidden, out.lengths

    def _store(self, streams: list[Any], out: ChunkOutput, slots: torch.Tensor) -> None:
        pool = self.pool
        for row, stream in enumerate(streams):
            n = int(out.lengths[row])
            if n == 0 or stream.done:
                continue
            if n != self.chunk_size:  # a short final chunk: its K/V is never read again
                continue
            if self.num_left_chunks >= 0 and len(stream.blocks) >= max(self.num_left_chunks, 0):
                if self.num_left_chunks == 0:
                    continue
                pool.free_blocks.append(stream.blocks.pop(0))
            elif len(stream.blocks) >= pool.blocks_per_stream:
                stream.overflow = True  # finished with "length" once this step's outputs are in
                continue
            block = pool.allocate()
            pool.write(block, list(out.kv), row)
            stream.blocks.append(block)
        if pool.conv is not None and out.conv_cache is not None:
            keep = (out.lengths > 0).view(1, -1, 1, 1)
            pool.conv[:, slots] = torch.where(keep, out.conv_cache.to(pool.conv.dtype), pool.conv[:, slots])


class SlotBackend(StreamingBackend):
    """Every declared :class:`StreamStateSpec` is one pool tensor with ``max_streams`` on its slot axis."""

    kind = "slot"

    def __init__(self, model: Any, **kw: Any):
        super().__init__(model, **kw)
        self.specs: dict[str, StreamStateSpec] = {s.name: s for s in self.encoder.streaming_state_specs}
        self.states: dict[str, torch.Tensor] = {}
        for spec in self.specs.values():
            shape = list(spec.shape)
            shape[spec.slot_axis] = self.max_streams
            self.states[spec.name] = torch.full(shape, spec.fill_value, dtype=_dtype(spec.dtype), device=self.device)
        #: the chunk step: the encoder's forward_chunk_slots, or its CUDA-graph replay (oasr.engine.graphs)
        self.step = self.encoder.forward_chunk_slots

    def allocate(self, stream: Any) -> None:
        """Write every state of the stream's slot: persistent ones from its request, the rest filled."""
        values = self.encoder.stream_request_state(stream.options)
        unknown = sorted(set(values) - {n for n, s in self.specs.items() if s.persistent})
        if unknown:
            raise CapabilityError(f"{type(self.encoder).__name__}.stream_request_state names {', '.join(unknown)}, "
                                  f"which are not persistent streaming_state_specs", capability="streaming")
        for name, spec in self.specs.items():
            row = self.states[name].select(spec.slot_axis, stream.slot)
            value = values.get(name, spec.fill_value) if spec.persistent else spec.fill_value
            if isinstance(value, torch.Tensor):
                row.copy_(value.reshape(row.shape))
            else:
                row.fill_(value)

    def reset(self, stream: Any) -> None:
        for name, spec in self.specs.items():
            if not spec.persistent:
                self.states[name].select(spec.slot_axis, stream.slot).fill_(spec.fill_value)

    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.states.values())

    def forward(self, streams, feats, feat_lens, offsets):
        slots = torch.tensor([s.slot for s in streams], device=self.device)
        cohort = {name: t.index_select(self.specs[name].slot_axis, slots) for name, t in self.states.items()}
        hidden, lengths, updated = self.step(feats, feat_lens, offsets, cohort)
        # a stream aborted meanwhile keeps its slot until the next step's admission rewrites it
        for name, tensor in updated.items():
            pool = self.states[name]
            pool.index_copy_(self.specs[name].slot_axis, slots, tensor.to(pool.dtype))
        return hidden, lengths


class StatefulBackend(StreamingBackend):
    """The encoder keeps one state object per stream; streams run one at a time (the parity oracle)."""

    kind = "stateful"

    def allocate(self, stream: Any) -> None:
        stream.state = self.encoder.init_stream_state(1, self.device)

    def release(self, stream: Any) -> None:
        stream.state = None

    def forward(self, streams, feats, feat_lens, offsets):
        required = self.chunk_size * self.num_left_chunks if self.num_left_chunks >= 0 else -1
        hiddens, lens = [], []
        for row, stream in enumerate(streams):
            hidden, length, state = self.encoder.forward_chunk_stateful(
                feats[row:row + 1], stream.state, feat_lens=feat_lens[row:row + 1], required_cache_size=required)
            stream.state = state
            hiddens.append(hidden[0])
            lens.append(torch.as_tensor(length).reshape(-1)[0])
        width = max(h.shape[0] for h in hiddens)
        out = hiddens[0].new_zeros(len(streams), width, hiddens[0].shape[-1])
        for row, h in enumerate(hiddens):
            out[row, : h.shape[0]] = h
        return out, torch.stack(lens)


#: the backend of each streaming kind
BACKENDS: dict[str, type[StreamingBackend]] = {cls.kind: cls for cls in (PagedBackend, SlotBackend, StatefulBackend)}


def build_backend(model: Any, **kw: Any) -> StreamingBackend:
    """The backend for ``model.encoder.streaming_kind``; an unknown kind names the valid ones."""
    kind = model.encoder.streaming_kind
    if kind == "none":
        raise CapabilityError(f"{type(model).__name__} cannot stream (encoder.streaming_kind='none'); "
                              f"use service_mode='offline'", capability="streaming")
    backend = BACKENDS.get(kind)
    if backend is None:
        raise CapabilityError(f"unknown streaming_kind {kind!r} on {type(model.encoder).__name__}; valid: "
                              f"{', '.join(BACKENDS)} or 'none'", capability="streaming")
    return backend(model, **kw)
