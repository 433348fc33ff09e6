"""The engine: requests in, transcripts out, over any registered architecture.

Offline mode batches waiting requests (see :mod:`oasr.engine.scheduler`), extracts features for
the batch, runs the decode strategy chosen from the model's capabilities, and isolates failures: a
request whose audio or row fails finishes alone with ``finish_reason="error"`` while the rest of its
batch completes.  Streaming mode (``service_mode="streaming"``) delegates to
:mod:`oasr.engine.streaming`.

Public methods may be called from several threads: admission and bookkeeping take a short lock,
and one step runs at a time.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np
import torch

from oasr import plugins, serde
from oasr.cancellation import cancellable
from oasr.checkpoints.loaded import LoadedModel
from oasr.checkpoints.loading import load_pretrained
from oasr.decoding.strategy import DecodeBatch, DecodeContext, DecodeStrategy
from oasr.decoding.types import Hypothesis, Segment
from oasr.engine.config import EngineConfig
from oasr.engine.device import engine_device
from oasr.engine.malloc import tune_allocator
from oasr.engine.metrics import EngineMetrics
from oasr.engine.options import DecodingOptions, RequestOutput
from oasr.engine.outputs import OutputCallback, build_output, deliver
from oasr.engine.scheduler import Scheduler
from oasr.errors import AudioError, CapabilityError, EngineFullError, OasrError, RequestError, TranscriptionError

logger = logging.getLogger("oasr.engine")

#: (segments now final, seconds of the request's audio decoded so far, language) — see transcribe_iter
SegmentCallback = Callable[[list[Segment], float, "str | None"], None]


class BatchCancelled(Exception):
    """Raised inside a forward when every request of the running batch has been aborted."""


def default_model() -> str:
    """The alias a model family marked as the default (the embedded model)."""
    aliases = [a for a in plugins.registry("aliases") if a.meta.get("default")]
    if not aliases:
        raise RequestError(
            "no model given and no installed family declares a default model; pass EngineConfig(model=...) "
            "or install a model family that declares one (oasr-models-hf declares its embedded model)"
        )
    return sorted(a.name for a in aliases)[0]


@attrs.define(eq=False)
class Request:
    request_id: str
    audio: torch.Tensor
    options: DecodingOptions
    priority: int
    arrival: float
    seq: int
    cost: int
    duration: float
    callback: OutputCallback | None = None
    skipped: int = 0
    output: RequestOutput | None = None
    done: threading.Event = attrs.field(factory=threading.Event)
    #: long-form: the pieces a request is decoded in (see oasr.engine.longform), and for a piece its
    #: request and index
    plan: Any = None
    #: called as windows of this request are decoded (strategies that decode window by window)
    on_segments: SegmentCallback | None = None
    parent: Request | None = None
    piece: int = 0


class Engine:
    """Offline and streaming speech recognition over one loaded model."""

    def __init__(self, config: EngineConfig | None = None, *, loaded: LoadedModel | None = None, **overrides: Any):
        if config is None:
            config = EngineConfig(**overrides)
        elif overrides:
            config = attrs.evolve(config, **overrides)
        self.config = config
        tune_allocator()  # process-wide glibc malloc thresholds (OASR_MALLOC_TUNING=0 opts out)
        self.device, _ = engine_device(config.device, config.dtype)
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        if loaded is None:
            loaded = load_pretrained(config.model or default_model(), architecture=config.architecture,
                                     device=self.device, dtype=config.dtype)
        self.loaded = loaded
        self.model = loaded.model
        model_cls = type(self.model)
        self.model.configure(serde.structure_options(
            config.model_options, model_cls.options_class, what=f"model option(s) for {model_cls.__name__}"))
        if config.quantization == "int8" and not loaded.quantization:
            from oasr.layers.quant import quantize_model_int8

            loaded.quantization = quantize_model_int8(self.model)
        from oasr.features import FeatureConfig
        from oasr.tokenizers import build_tokenizer

        self.tokenizer = build_tokenizer(loaded.tokenizer_spec, loaded.tokenizer_root)
        self.feature_config = FeatureConfig.from_spec(loaded.feature_spec)
        self.feature_config.check_frontend()
        self.sample_rate = int(self.feature_config.sample_rate)
        self.strategy = self._build_strategy()
        self.window_seconds: float | None = getattr(self.feature_config, "fixed_window_seconds", None)
        self._hop = max(1, round(self.sample_rate * self.feature_config.frame_shift_ms / 1000.0))
        from oasr.engine.memory import ForwardMemory

        self.forward_memory = ForwardMemory.for_engine(self)
        self.scheduler = Scheduler(
            policy=config.schedule_policy,
            max_batch_size=config.max_batch_size,
            max_batch_frames=config.max_batch_frames,
            max_pad_ratio=config.max_pad_ratio,
            max_wait_time=config.max_wait_time,
            starvation_limit=config.starvation_limit,
            fixed_cost=self.window_seconds is not None and not self.strategy.supports_long_form,
            fits_memory=self.forward_memory.fits_batch,
        )
        self.metrics = EngineMetrics()
        from oasr.engine.longform import LongForm

        self.long_form = LongForm(self)
        self._lock = threading.RLock()
        self._step_lock = threading.Lock()
        self._requests: dict[str, Request] = {}
        self._seq = itertools.count()
        self._closed = False
        # cooperative cancellation: every module call of the running batch checks whether anyone still waits
        self._running: Sequence[Request] = ()
        self._cancel_hooks = [m.register_forward_pre_hook(self._check_cancelled) for m in self.model.modules()]
        self._streaming = None
        if config.service_mode == "streaming":
            from oasr.engine.streaming import StreamingExecutor

            self._streaming = StreamingExecutor(self)

    # -- construction helpers --------------------------------------------------------------------------
    def _build_strategy(self) -> DecodeStrategy:
        """The strategy of the requested (or the model's default) decode method; its declared
        requirements are checked against the model here, at construction."""
        model = self.model
        method = self.config.decode_method or self.loaded.decoding_defaults.decode_type
        _, _, bare = method.rpartition(":")
        if bare not in model.capabilities:
            raise CapabilityError(
                f"decode method {method!r} is not served by this {self.loaded.architecture} checkpoint; "
                f"it serves: {', '.join(sorted(model.capabilities))}",
                capability=method,
            )
        strategy_cls = plugins.resolve_decoder(method, self._model_distribution()).load()
        options = strategy_cls.parse_options(self.config.decode_options)
        frame_shift = self.feature_config.frame_shift_ms / 1000.0 * max(1, int(self.feature_config.lfr_n))
        ctx = DecodeContext(model=model, tokenizer=self.tokenizer, decoding_defaults=self.loaded.decoding_defaults,
                            feature_config=self.feature_config, device=self.device,
                            frame_shift=frame_shift, sample_rate=int(self.feature_config.sample_rate),
                            source=self.loaded.source)
        return strategy_cls(ctx, options)

    def _model_distribution(self) -> str | None:
        entry = plugins.registry("models").find(self.loaded.architecture)
        return entry.distribution if entry is not None else None

    @property
    def decode_method(self) -> str:
        return self.strategy.family

    # -- admission -------------------------------------------------------------------------------------
    def load_audio(self, audio: Any, sample_rate: int | None) -> np.ndarray:
        """Any ``oasr.audio.load`` source as float32 samples at the model's rate.  ``sample_rate``
        describes raw sample arrays; encoded audio (paths, bytes, files) carries its own."""
        from oasr.audio import is_samples_with_rate, load

        raw = isinstance(audio, (np.ndarray, torch.Tensor)) or is_samples_with_rate(audio)
        # encoded audio: the engine's limit is enforced while decoding (arrays are checked after, by check_duration)
        limit = None if raw else self.config.max_audio_seconds
        return load(audio, self.sample_rate, sample_rate=sample_rate if raw else None, max_seconds=limit,
                    limit_hint="max_seconds / OASR_MAX_AUDIO_SECONDS" if limit is None
                    else "EngineConfig.max_audio_seconds, oasr serve --max-audio-seconds")

    def check_duration(self, duration: float, request_id: str) -> None:
        """Refuse audio past ``max_audio_seconds``, or past a fixed window the family cannot long-form."""
        limit = self.config.max_audio_seconds
        if limit is not None and duration > limit:
            raise RequestError(f"request {request_id}: audio is {duration:.1f} s, longer than the engine's "
                               f"max_audio_seconds={limit:g}", request_id=request_id, param="file")
        window = self.window_seconds
        if window is not None and duration > window + 1e-6:
            if not self.strategy.supports_long_form:
                raise RequestError(
                    f"request {request_id}: audio is {duration:.1f} s but this model reads a fixed {window:g} s "
                    f"window and decode method {self.strategy.family!r} has no long-form mode; split the audio",
                    request_id=request_id, param="file")
            if not self.config.long_form:
                raise RequestError(
                    f"request {request_id}: audio is {duration:.1f} s, past the model's {window:g} s window, and "
                    f"long-form decoding is disabled (EngineConfig.long_form=False)",
                    request_id=request_id, param="file")
        if self.config.service_mode == "offline":  # streaming forwards are chunked
            self.forward_memory.check(duration, request_id)

    def _admit(self, audio: Any, request_id: str | None, sample_rate: int | None,
               decoding: DecodingOptions | None, priority: int, callback: OutputCallback | None) -> Request:
        if self._closed:
            raise RequestError("the engine is shut down")
        request_id = request_id or uuid.uuid4().hex
        options = decoding or DecodingOptions()
        self.strategy.validate(options, request_id)
        samples = torch.from_numpy(np.ascontiguousarray(self.load_audio(audio, sample_rate), dtype=np.float32))
        duration = samples.numel() / self.sample_rate
        plan = self.long_form.plan(samples, options, request_id)
        if plan is None:
            self.check_duration(duration, request_id)
        elif self.config.max_audio_seconds is not None and duration > self.config.max_audio_seconds:
            self.check_duration(duration, request_id)
        if plan is not None and plan.pieces:
            options = self.strategy.plan_options(
                options, (self.long_form.piece_audio(samples, plan, piece) for piece in plan.pieces))
        request = Request(request_id, samples, options, priority, time.monotonic(), 0, self._cost(samples.numel()),
                          duration, callback, plan=plan)
        return request

    def _cost(self, num_samples: int) -> int:
        if self.window_seconds is not None and not self.strategy.supports_long_form:
            return round(self.window_seconds * self.sample_rate) // self._hop
        return num_samples // self._hop + 1

    def _pieces(self, request: Request) -> list[Request]:
        """A long-form request's pieces, as requests the scheduler batches like any other."""
        out = []
        for index, piece in enumerate(request.plan.pieces):
            audio = self.long_form.piece_audio(request.audio, request.plan, piece)
            out.append(Request(f"{request.request_id}#{index}", audio, request.options, request.priority,
                               request.arrival, next(self._seq), self._cost(audio.numel()),
                               audio.numel() / self.sample_rate, parent=request, piece=index))
        return out

    def add_request(self, audio: Any, *, request_id: str | None = None, sample_rate: int | None = None,
                    decoding: DecodingOptions | None = None, priority: int = 0,
                    callback: OutputCallback | None = None, on_segments: SegmentCallback | None = None) -> str:
        """Queue one offline request; returns its id.  Bad audio or options raise here, alone.

        ``on_segments(segments, seconds_done, language)`` is called as the request's windows are
        decoded, by strategies that decode window by window (the final output still goes to ``callback``).
        """
        return self._submit(audio, request_id, sample_rate, decoding, priority, callback,
                            on_segments).request_id

    def _submit(self, audio: Any, request_id: str | None, sample_rate: int | None, decoding: DecodingOptions | None,
                priority: int, callback: OutputCallback | None, on_segments: SegmentCallback | None = None) -> Request:
        if self._streaming is not None:
            raise RequestError("this engine is in streaming mode: use add_streaming_request / feed_chunk, "
                               "or transcribe(..., streaming=True)")
        request = self._admit(audio, request_id, sample_rate, decoding, priority, callback)
        request.on_segments = on_segments
        with self._lock:
            if request.request_id in self._requests:
                raise RequestError(f"request id {request.request_id!r} is already in use",
                                   request_id=request.request_id)
            if self.config.max_queue is not None and len(self.scheduler) >= self.config.max_queue:
                raise EngineFullError(f"the engine queue is full ({self.config.max_queue} waiting requests)")
            request.seq = next(self._seq)
            self._requests[request.request_id] = request
            self.metrics.on_admit(request.duration)
            if request.plan is None:
                self.scheduler.add(request)
            elif not request.plan.pieces:  # vad_filter found no speech
                self._finish(request, self.long_form.output(request))
            else:
                for piece in self._pieces(request):
                    self.scheduler.add(piece)
        return request

    def abort_request(self, request_id: str) -> bool:
        """Abort a waiting or running request; True if it was still pending."""
        if self._streaming is not None and self._streaming.abort(request_id):
            return True
        with self._lock:
            request = self._requests.get(request_id)
            if request is None or request.done.is_set():
                return False
            self.scheduler.remove(request_id)
            for index in range(len(request.plan.pieces) if request.plan is not None else 0):
                self.scheduler.remove(f"{request_id}#{index}")
            self._finish(request, RequestOutput(request_id, finished=True, finish_reason="abort",
                                                duration=request.duration))
            return True

    # -- stepping --------------------------------------------------------------------------------------
    def has_unfinished_requests(self) -> bool:
        if self._streaming is not None and self._streaming.has_work():
            return True
        with self._lock:
            return bool(self.scheduler)

    def step(self, *, flush: bool = False) -> list[RequestOutput]:
        """Run one batch (offline) or one chunk step over all ready streams; return new outputs."""
        if self._streaming is not None:
            return self._streaming.step()
        with self._step_lock:
            with self._lock:
                batch: list[Request] = self.scheduler.schedule(flush=flush)
            if not batch:
                return []
            self._running = batch
            try:
                results = self._decode_isolated(batch)
            finally:
                self._running = ()
            outputs = []
            with self._lock:
                for request, result in zip(batch, results, strict=False):
                    if request.parent is not None:  # a long-form piece
                        whole = self.long_form.collect(request, result)
                        if whole is not None and not request.parent.done.is_set():
                            outputs.append(self._finish(request.parent, whole))
                        continue
                    if request.done.is_set():  # aborted while running
                        continue
                    outputs.append(self._finish(request, self._to_output(request, result)))
                self.metrics.on_batch(len(batch))
            return outputs

    def run(self) -> list[RequestOutput]:
        """Step until every queued request has finished; return the outputs in completion order."""
        outputs: list[RequestOutput] = []
        while self.has_unfinished_requests():
            outputs.extend(self.step(flush=True))
        return outputs

    def _decode(self, requests: Sequence[Request]) -> list[Hypothesis | BaseException]:
        with cancellable(self._raise_if_abandoned):  # feature extraction stops at its next tile, too
            return self._decode_batch(requests)

    def _decode_batch(self, requests: Sequence[Request]) -> list[Hypothesis | BaseException]:
        batch = DecodeBatch(request_ids=[r.request_id for r in requests], options=[r.options for r in requests],
                            waveforms=[r.audio for r in requests], on_segments=_segment_sink(requests))
        if self.strategy.needs_features:
            from oasr.features import extract_features_batch

            t0 = time.perf_counter()
            feats, feat_lens = extract_features_batch(batch.waveforms, self.feature_config, device=self.model.device)
            batch.feats = feats.to(self.model.device, self.model.compute_dtype)
            batch.feat_lens = feat_lens.to(self.model.device)
            batch.timings["features"] = time.perf_counter() - t0
        with torch.inference_mode():
            results = self.strategy.decode(batch)
        if len(results) != len(requests):
            raise RuntimeError(f"decode strategy {self.strategy.family!r} returned {len(results)} results "
                               f"for {len(requests)} requests")
        self.metrics.on_timings(batch.timings)
        return results

    def _check_cancelled(self, module: Any, args: Any) -> None:
        """A forward pre-hook: leave the running batch at its next module once all its requests are aborted
        (rows of a partly aborted batch run on; aborted ones are dropped when the batch ends)."""
        self._raise_if_abandoned()

    def _raise_if_abandoned(self) -> None:
        running = self._running
        if running and all(_abandoned(r) for r in running):
            raise BatchCancelled(f"all {len(running)} request(s) of the running batch were aborted")

    def _decode_isolated(self, requests: Sequence[Request]) -> list[Hypothesis | BaseException]:
        """Decode a batch; if the batch as a whole fails, decode each request alone to isolate it."""
        try:
            return self._decode(requests)
        except BatchCancelled as exc:
            return [exc] * len(requests)
        except Exception as exc:  # one bad row must not fail the others
            if len(requests) == 1:
                return [exc]
            logger.warning("batch of %d failed (%s); retrying each request alone", len(requests), exc)
            out: list[Hypothesis | BaseException] = []
            for request in requests:
                try:
                    out.extend(self._decode([request]))
                except Exception as row_exc:
                    out.append(row_exc)
            return out

    # -- outputs ---------------------------------------------------------------------------------------
    def _to_output(self, request: Request, result: Hypothesis | BaseException) -> RequestOutput:
        if isinstance(result, BaseException):
            if isinstance(result, OasrError):
                message = str(result)
            else:
                logger.error("request %s failed", request.request_id, exc_info=result)
                message = f"internal error while decoding: {type(result).__name__}: {result}"
            return RequestOutput(request.request_id, finished=True, finish_reason="error", error=message,
                                 duration=request.duration)
        return build_output(request.request_id, result, self.tokenizer, request.options, request.duration)

    def _finish(self, request: Request, output: RequestOutput) -> RequestOutput:
        request.output = output
        request.done.set()
        self._requests.pop(request.request_id, None)
        self.metrics.on_finish(output.finish_reason or "stop")
        deliver(request.callback, output)
        return output

    # -- convenience -----------------------------------------------------------------------------------
    def transcribe_outputs(self, audio: Any | Sequence[Any], *, decoding: DecodingOptions | None = None,
                           sample_rate: int | None = None, streaming: bool = False,
                           progress: Callable[[RequestOutput], None] | None = None):
        """Transcribe one input or a list; RequestOutputs in input order (errors per row, not raised).

        ``(samples, rate)`` is one input; a list of plain numbers is refused (samples belong in an array).
        """
        from oasr.audio import is_sample_list, is_samples_with_rate

        if is_sample_list(audio):
            raise AudioError(f"transcribe() got a {type(audio).__name__} of {len(audio)} numbers, which would be "
                             f"{len(audio)} inputs; pass one recording as a numpy array "
                             f"(np.asarray(samples, dtype=np.float32)) with its sample_rate")
        single = not isinstance(audio, (list, tuple)) or is_samples_with_rate(audio)
        items = [audio] if single else list(audio)
        if streaming or self._streaming is not None:
            if self._streaming is None:
                raise RequestError("transcribe(streaming=True) needs an engine built with service_mode='streaming'")
            if decoding is not None and decoding.vad_filter:
                raise RequestError("vad_filter applies to offline requests; a stream is decoded as it arrives",
                                   param="vad_filter")
            outputs = self._streaming.transcribe(items, decoding=decoding, sample_rate=sample_rate, progress=progress)
            return outputs[0] if single else outputs
        requests: list[Request | RequestOutput] = []
        for item in items:
            try:
                requests.append(self._submit(item, None, sample_rate, decoding, 0, progress))
            except OasrError as exc:
                failed = RequestOutput(uuid.uuid4().hex, finished=True, finish_reason="error", error=str(exc))
                self.metrics.on_finish("error")
                if progress is not None:
                    progress(failed)
                requests.append(failed)
        for item in requests:
            if isinstance(item, Request):
                while not item.done.is_set():
                    if not self.step(flush=True):
                        item.done.wait(0.001)
        outputs = [r if isinstance(r, RequestOutput) else r.output for r in requests]
        if sample_rate is None:
            for item, output in zip(items, outputs, strict=True):
                _warn_if_rate_assumed(item, output, self.sample_rate)
        return outputs[0] if single else outputs

    def transcribe_iter(self, audio: Any, *, decoding: DecodingOptions | None = None, sample_rate: int | None = None):
        """faster-whisper's shape: ``segments, info = engine.transcribe_iter(audio)``; ``segments`` is an
        iterator yielding each Segment as soon as it is final (see :mod:`oasr.engine.iterate`)."""
        from oasr.engine.iterate import transcribe_iter

        return transcribe_iter(self, audio, decoding=decoding, sample_rate=sample_rate)

    def transcribe(self, audio: Any | Sequence[Any], *, decoding: DecodingOptions | None = None,
                   sample_rate: int | None = None, streaming: bool = False):
        """Text for one input, or a list of texts in input order.

        Raises :class:`TranscriptionError` (a :class:`RequestError`) if any input failed; its
        ``outputs`` has every row's RequestOutput, the successful ones included.  Use
        :meth:`transcribe_outputs` to get errors per row.
        """
        outputs = self.transcribe_outputs(audio, decoding=decoding, sample_rate=sample_rate, streaming=streaming)
        rows = [outputs] if isinstance(outputs, RequestOutput) else outputs
        failed = [(i, o) for i, o in enumerate(rows) if o.finish_reason == "error"]
        if failed:
            detail = "; ".join(f"input {i}: {o.error}" for i, o in failed)
            raise TranscriptionError(f"{len(failed)} of {len(rows)} input(s) failed: {detail}", outputs=rows)
        return outputs.text if isinstance(outputs, RequestOutput) else [o.text for o in outputs]

    def metrics_snapshot(self) -> dict[str, Any]:
        snap = self.metrics.snapshot()
        with self._lock:
            snap["queue_depth"] = len(self.scheduler)
        snap["streams"] = self._streaming.active_streams() if self._streaming is not None else 0
        return snap

    def shutdown(self) -> None:
        """Refuse new requests and abort the waiting ones."""
        self._closed = True
        with self._lock:
            for request_id in list(self._requests):
                self.abort_request(request_id)
        if self._streaming is not None:
            self._streaming.shutdown()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    # -- streaming API (delegated) -----------------------------------------------------------------------
    def _require_streaming(self):
        if self._streaming is None:
            raise RequestError("this engine is in offline mode; build it with EngineConfig(service_mode='streaming')")
        return self._streaming

    def add_streaming_request(self, *, request_id: str | None = None, sample_rate: int | None = None,
                              decoding: DecodingOptions | None = None, callback: OutputCallback | None = None) -> str:
        if decoding is not None and decoding.vad_filter:
            raise RequestError("vad_filter applies to offline requests; a stream is decoded as it arrives",
                               param="vad_filter")
        return self._require_streaming().add(request_id=request_id, sample_rate=sample_rate, decoding=decoding,
                                             callback=callback)

    def feed_chunk(self, request_id: str, samples: Any, is_last: bool = False) -> None:
        self._require_streaming().feed(request_id, samples, is_last=is_last)


ASREngine = Engine


def _warn_if_rate_assumed(item: Any, output: RequestOutput, rate: int) -> None:
    """An empty transcript of a raw array that is not silent, read at the model's rate because no
    ``sample_rate`` was given, is most often audio recorded at another rate: say so."""
    if output.finish_reason == "error" or output.text.strip():
        return
    samples = item.detach().cpu().float().numpy() if isinstance(item, torch.Tensor) else item
    if not isinstance(samples, np.ndarray) or samples.dtype.kind != "f" or samples.size == 0:
        return
    if float(np.abs(samples).max()) < 0.01:
        return  # (near) silence: an empty transcript is the expected one
    import warnings

    warnings.warn(f"request {output.request_id}: the transcript is empty although the audio is not silent; "
                  f"a raw array without sample_rate is read at the model's {rate} Hz: if it was recorded at "
                  f"another rate (44100, 48000, ...), pass sample_rate= or (samples, rate)", RuntimeWarning,
                  stacklevel=4)


def _abandoned(request: Request) -> bool:
    """Nobody waits for ``request`` any more (it, or the long-form request it is a piece of, was aborted)."""
    return request.done.is_set() or (request.parent is not None and request.parent.done.is_set())


def _segment_sink(requests: Sequence[Request]):
    """The batch's ``on_segments``: routes a row's final segments to its request's ``on_segments``."""
    if not any(r.on_segments for r in requests):
        return None

    def sink(row: int, segments: list[Segment], seconds_done: float, language: str | None = None) -> None:
        callback = requests[row].on_segments
        if callback is None:
            return
        try:
            callback(segments, seconds_done, language)
        except Exception:
            logger.exception("segment callback of request %s raised", requests[row].request_id)

    return sink
