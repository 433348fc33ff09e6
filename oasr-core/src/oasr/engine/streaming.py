"""Streaming service: per-stream state in pre-allocated pools, every ready stream in one forward.

A stream is admitted to a *slot* (at most ``max_streams`` at once; later streams wait in FIFO
order).  Audio fed to it is resampled, turned into features incrementally (the extractor's declared
framing makes chunked features equal offline ones), cut into the encoder's streaming windows
(``encoder.streaming_geometry(chunk_size)``) and advanced through the backend of
``encoder.streaming_kind`` (:mod:`oasr.engine.backends`: ``paged``, ``slot``, ``stateful``).

All pools are allocated at construction; nothing grows with the number of chunks.  A stream whose
history would pass the pool's per-stream ceiling finishes with ``finish_reason="length"``.
Each chunk's encoder frames go to the decode strategy (``advance_streams``), whose per-stream
search applies its own head; partial outputs (``finished=False``) follow every chunk.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections import deque
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np
import torch

from oasr.audio import stream_chunk
from oasr.engine.backends import PagedBackend, SlotBackend, build_backend
from oasr.engine.graphs import StepGraphs, graph_refusal
from oasr.engine.options import DecodingOptions, RequestOutput
from oasr.engine.outputs import build_output, deliver
from oasr.errors import CapabilityError, EngineFullError, RequestError

if TYPE_CHECKING:
    from oasr.engine.engine import Engine


@attrs.define(eq=False)
class Stream:
    request_id: str
    options: DecodingOptions
    callback: Any
    input_rate: int
    arrival: float
    resampler: Any = None
    slot: int | None = None
    pending: list[np.ndarray] = attrs.field(factory=list)
    is_last: bool = False
    flushed: bool = False
    feats: list[torch.Tensor] = attrs.field(factory=list)
    feat_frames: int = 0
    feat_pos: int = 0
    offset: int = 0
    blocks: list[int] = attrs.field(factory=list)
    state: Any = None
    search: Any = None
    hidden: list[torch.Tensor] = attrs.field(factory=list)
    samples_in: int = 0
    last_text: str = ""
    overflow: bool = False
    done: bool = False
    output: RequestOutput | None = None
    finished_event: threading.Event = attrs.field(factory=threading.Event)


class StreamingExecutor:
    def __init__(self, engine: Engine):
        self.engine = engine
        config = engine.config
        model = engine.model
        encoder = model.encoder
        if encoder.streaming_kind == "none":
            raise CapabilityError(
                f"this {engine.loaded.architecture} checkpoint cannot stream (encoder.streaming_kind='none'); "
                f"use service_mode='offline'", capability="streaming")
        engine.strategy.check_streaming()
        if int(getattr(engine.feature_config, "lfr_m", 1)) != 1:
            raise CapabilityError("streaming does not support LFR-stacked features", capability="streaming")
        chunk_size = config.chunk_size if config.chunk_size is not None else encoder.default_chunk_size
        encoder.prepare_streaming(chunk_size, config.num_left_chunks)
        self.kind = encoder.streaming_kind
        self.chunk_size = chunk_size
        self.geometry = encoder.streaming_geometry(chunk_size)
        self.context = encoder.right_context + 1
        self.max_streams = config.max_streams
        self.num_left_chunks = config.num_left_chunks
        frame_s = engine.strategy.ctx.frame_shift * encoder.subsampling_rate
        self.frame_seconds = frame_s
        max_frames = math.ceil(config.max_stream_seconds / frame_s)
        self.max_chunks = math.ceil(max_frames / self.chunk_size)
        self.lock = threading.RLock()
        self.step_lock = threading.Lock()
        device = engine.device
        self.backend = build_backend(model, max_streams=self.max_streams, chunk_size=self.chunk_size,
                                     num_left_chunks=self.num_left_chunks, max_chunks=self.max_chunks,
                                     dtype=model.compute_dtype, device=device, lock=self.lock)
        #: the paged backend's block pool (None for the other kinds)
        self.pool = self.backend.pool if isinstance(self.backend, PagedBackend) else None
        from oasr.features import BatchedStreamingFeatureExtractor

        self.extractor = BatchedStreamingFeatureExtractor(engine.feature_config, self.max_streams, device=device)
        #: why the chunk step is not replayed from CUDA graphs (None: it is)
        self.graph_refusal = graph_refusal(enabled=config.cuda_graphs, device=device, streaming_kind=self.kind,
                                           encoder=encoder)
        self.step_graphs = StepGraphs(encoder.forward_chunk_slots) if self.graph_refusal is None else None
        if self.step_graphs is not None and isinstance(self.backend, SlotBackend):
            self.backend.step = self.step_graphs
        self.free_slots: deque[int] = deque(range(self.max_streams))
        self.streams: dict[str, Stream] = {}
        self.waiting: deque[Stream] = deque()
        self.closed = False

    # -- bookkeeping ---------------------------------------------------------------------------------
    def pool_bytes(self) -> int:
        return self.backend.nbytes()

    def active_streams(self) -> int:
        with self.lock:
            return sum(1 for s in self.streams.values() if s.slot is not None)

    def has_work(self) -> bool:
        with self.lock:
            return bool(self.streams)

    def add(self, *, request_id: str | None, sample_rate: int | None, decoding: DecodingOptions | None,
            callback: Any) -> str:
        if self.closed:
            raise RequestError("the engine is shut down")
        request_id = request_id or uuid.uuid4().hex
        options = decoding or DecodingOptions()
        self.engine.strategy.validate(options, request_id)
        rate = int(sample_rate or self.engine.sample_rate)
        if rate <= 0:
            raise RequestError(f"sample_rate must be positive, got {rate}", request_id=request_id, param="sample_rate")
        stream = Stream(request_id, options, callback, rate, time.monotonic())
        if rate != self.engine.sample_rate:
            import soxr

            stream.resampler = soxr.ResampleStream(rate, self.engine.sample_rate, 1, dtype="float32")
        with self.lock:
            if request_id in self.streams:
                raise RequestError(f"request id {request_id!r} is already in use", request_id=request_id)
            if self.engine.config.max_queue is not None and len(self.waiting) >= self.engine.config.max_queue:
                raise EngineFullError(f"the stream queue is full ({self.engine.config.max_queue} waiting streams)")
            self.streams[request_id] = stream
            self.waiting.append(stream)
            self.engine.metrics.on_admit(0.0)
        return request_id

    def feed(self, request_id: str, samples: Any, *, is_last: bool = False) -> None:
        with self.lock:
            stream = self.streams.get(request_id)
            if stream is None:
                raise RequestError(f"no active stream {request_id!r}", request_id=request_id)
            if stream.is_last:
                raise RequestError(f"stream {request_id!r} already received its last chunk", request_id=request_id)
        data = stream_chunk(samples, f"of stream {request_id}")
        if stream.resampler is not None:
            data = stream.resampler.resample_chunk(data, last=is_last)
        with self.lock:
            if data.size:
                stream.pending.append(data)
                stream.samples_in += data.size
                self.engine.metrics.on_audio(data.size / self.engine.sample_rate)
            stream.is_last = stream.is_last or is_last

    def abort(self, request_id: str) -> bool:
        with self.lock:
            stream = self.streams.get(request_id)
            if stream is None:
                return False
            self._finish(stream, RequestOutput(request_id, text=stream.last_text, finished=True,
                                               finish_reason="abort", duration=self._duration(stream)))
            return True

    def shutdown(self) -> None:
        self.closed = True
        for request_id in list(self.streams):
            self.abort(request_id)

    # -- stepping --------------------------------------------------------------------------------------
    def _admit_waiting(self) -> None:
        while self.waiting and self.free_slots:
            stream = self.waiting.popleft()
            if stream.done:
                continue
            stream.slot = self.free_slots.popleft()
            self.extractor.reset(stream.slot)
            self.backend.allocate(stream)
            stream.search = self._new_search(stream)

    @property
    def pool_device(self) -> torch.device:
        return self.engine.device

    def reset_turn(self, request_id: str) -> bool:
        """Start a new turn on a stream: the encoder forgets what it heard (its offset, caches and
        search restart) while what the request asked for (persistent state, options) is kept."""
        with self.lock:
            stream = self.streams.get(request_id)
            if stream is None or stream.done:
                return False
            if stream.slot is not None:
                self.backend.reset(stream)
                stream.search = self._new_search(stream)
            stream.offset = 0
            stream.hidden.clear()
            return True

    def _pull_features(self, stream: Stream) -> None:
        if stream.pending:
            audio = np.concatenate(stream.pending)
            stream.pending.clear()
            feats = self.extractor.process_chunk(stream.slot, torch.from_numpy(audio))
            if feats is not None and feats.shape[0]:
                stream.feats.append(feats)
                stream.feat_frames += feats.shape[0]
        if stream.is_last and not stream.flushed:
            stream.flushed = True
            feats = self.extractor.flush(stream.slot)
            if feats is not None and feats.shape[0]:
                stream.feats.append(feats)
                stream.feat_frames += feats.shape[0]
            tail = self.engine.model.encoder.streaming_tail_frames
            if tail and stream.feat_frames:  # the encoder's end-of-stream padding frames
                pad = self.engine.model.encoder.streaming_pad_value
                stream.feats.append(torch.full((tail, self.extractor.feature_dim), pad, device=self.extractor.device))
                stream.feat_frames += tail

    def _window(self, stream: Stream) -> torch.Tensor | None:
        """The stream's next feature window, or None if it is not ready."""
        available = stream.feat_frames - stream.feat_pos
        full = self.geometry.window_frames
        if available < full and not (stream.flushed and available >= self.context):
            return None
        if len(stream.feats) > 1:
            stream.feats = [torch.cat(stream.feats)]
        buffer = stream.feats[0]
        # keep only what later windows need: the buffer starts at feat_pos
        window = buffer[: min(full, available)]
        return window

    def _consume(self, stream: Stream) -> None:
        stride = self.geometry.stride_frames
        buffer = stream.feats[0]
        stream.feats = [buffer[stride:]] if buffer.shape[0] > stride else []
        stream.feat_pos += stride
        stream.feat_frames = stream.feat_pos + (stream.feats[0].shape[0] if stream.feats else 0)

    def _finished_audio(self, stream: Stream) -> bool:
        return stream.flushed and (stream.feat_frames - stream.feat_pos) < self.context

    def step(self) -> list[RequestOutput]:
        with self.step_lock:
            with self.lock:
                self._admit_waiting()
                active = [s for s in self.streams.values() if s.slot is not None and not s.done]
                for stream in active:
                    self._pull_features(stream)
                ready: list[tuple[Stream, torch.Tensor]] = []
                for stream in active:
                    window = self._window(stream)
                    if window is not None:
                        ready.append((stream, window))
            outputs: list[RequestOutput] = []
            if ready:
                t0 = time.perf_counter()
                with torch.inference_mode():
                    hidden, lengths = self._forward(ready)
                t1 = time.perf_counter()
                with self.lock, torch.inference_mode():
                    counts = [0 if stream.done else int(lengths[row]) for row, (stream, _) in enumerate(ready)]
                    self.engine.strategy.advance_streams([s.search for s, _ in ready], hidden, counts)
                    for row, (stream, _) in enumerate(ready):
                        if stream.done:
                            continue
                        n = counts[row]
                        self._consume(stream)
                        if n:
                            if stream.search.keeps_hidden:
                                stream.hidden.append(hidden[row, :n].detach().clone())
                            stream.offset += n
                        if stream.overflow:
                            outputs.append(self._finish(stream, self._final_output(stream, reason="length")))
                        elif self._finished_audio(stream):
                            outputs.append(self._finalize(stream))
                        else:
                            outputs.extend(self._partial(stream))
                self.engine.metrics.on_timings({"encoder": t1 - t0, "decode": time.perf_counter() - t1})
                self.engine.metrics.on_batch(len(ready))
            with self.lock:
                for stream in [s for s in self.streams.values() if s.slot is not None and not s.done]:
                    if self._finished_audio(stream) and not any(stream is r for r, _ in ready):
                        outputs.append(self._finalize(stream))
            return outputs

    # -- backend --------------------------------------------------------------------------------------
    def _forward(self, ready: list[tuple[Stream, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        model = self.engine.model
        device = self.pool_device
        dtype = model.compute_dtype
        width = self.geometry.window_frames
        feats = torch.zeros(len(ready), width, ready[0][1].shape[-1], dtype=dtype, device=device)
        feat_lens = torch.zeros(len(ready), dtype=torch.long, device=device)
        for row, (_, window) in enumerate(ready):
            feats[row, : window.shape[0]] = window.to(device, dtype)
            feat_lens[row] = window.shape[0]
        offsets = torch.tensor([s.offset for s, _ in ready], device=device)
        return self.backend.forward([s for s, _ in ready], feats, feat_lens, offsets)

    # -- search and outputs ----------------------------------------------------------------------------
    def _new_search(self, stream: Stream):
        return self.engine.strategy.stream_search(stream.options)

    def _duration(self, stream: Stream) -> float:
        return stream.samples_in / self.engine.sample_rate

    def _partial(self, stream: Stream) -> list[RequestOutput]:
        hyp = stream.search.best()
        text = self.engine.tokenizer.decode(hyp.tokens)
        if text == stream.last_text:
            return []
        stream.last_text = text
        out = RequestOutput(stream.request_id, text=text, tokens=list(hyp.tokens), finished=False,
                            duration=self._duration(stream))
        deliver(stream.callback, out)
        return [out]

    def _final_output(self, stream: Stream, *, reason: str = "stop") -> RequestOutput:
        hyp = stream.search.final(stream.hidden, self.frame_seconds)
        out = build_output(stream.request_id, hyp, self.engine.tokenizer, stream.options, self._duration(stream))
        out.finish_reason = reason
        return out

    def _finalize(self, stream: Stream) -> RequestOutput:
        return self._finish(stream, self._final_output(stream))

    def _finish(self, stream: Stream, output: RequestOutput) -> RequestOutput:
        if stream.done:
            return stream.output
        stream.done = True
        stream.output = output
        if stream.slot is not None:
            self.backend.release(stream)
            self.free_slots.append(stream.slot)
            stream.slot = None
        stream.hidden.clear()
        self.streams.pop(stream.request_id, None)
        self.engine.metrics.on_finish(output.finish_reason or "stop")
        stream.finished_event.set()
        deliver(stream.callback, output)
        return output

    # -- convenience -----------------------------------------------------------------------------------
    def transcribe(self, items: list[Any], *, decoding, sample_rate, progress=None) -> list[RequestOutput]:
        """Stream whole inputs through the streaming path in chunk-sized pieces."""
        results: list[RequestOutput | None] = [None] * len(items)
        ids = []
        audio = []
        for i, item in enumerate(items):
            try:
                samples = self.engine.load_audio(item, sample_rate)
            except Exception as exc:
                results[i] = RequestOutput(uuid.uuid4().hex, finished=True, finish_reason="error", error=str(exc))
                ids.append(None)
                audio.append(None)
                continue
            ids.append(self.add(request_id=None, sample_rate=None, decoding=decoding, callback=None))
            audio.append(samples)
        piece = int(self.geometry.stride_frames * self.engine._hop)
        cursors = [0] * len(items)
        while True:
            pending = False
            for i, rid in enumerate(ids):
                if rid is None or results[i] is not None:
                    continue
                stream = self.streams.get(rid)
                if stream is not None and not stream.is_last:
                    chunk = audio[i][cursors[i]: cursors[i] + piece]
                    cursors[i] += piece
                    self.feed(rid, chunk, is_last=cursors[i] >= audio[i].size)
                pending = True
            for out in self.step():
                if out.finished:
                    i = ids.index(out.request_id)
                    results[i] = out
                    if progress is not None:
                        progress(out)
            if not pending:
                break
        return results
