"""The engine loop thread and the asyncio handles requests wait on.

One thread (``oasr-engine``) owns ``engine.step()``: it steps while the engine has work and sleeps on
a wake event otherwise.  The asyncio side never blocks on the engine:

- admission (``engine.add_request``, which decodes and resamples the audio) and streaming feeds run in
  worker threads (``asyncio.to_thread``), then wake the loop thread;
- every output reaches the request's :class:`RequestHandle` through ``loop.call_soon_threadsafe``.

The engine reports an output twice (the request's callback and ``step()``'s return value, which also
carries streaming partials); both go through :meth:`EngineRunner._deliver`, which drops a final already
delivered and a partial whose text did not change, so each handle sees every new output exactly once.

Waits are bounded: a handle's consumer gives a deadline, the loop thread never sleeps longer than
``idle_interval``, and :meth:`EngineRunner.drain` waits at most its grace period.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import attrs

from oasr.audio import DECODE_CANCELLED
from oasr.engine import DecodingOptions, Engine, RequestOutput
from oasr.serve.errors import unavailable

logger = logging.getLogger("oasr.serve")

#: consecutive failed engine steps after which the runner reports itself failed (not ready, 503)
MAX_STEP_FAILURES = 3
#: how long :meth:`EngineRunner.stop` waits for the loop thread's current step to end
STOP_JOIN_SECONDS = 5.0


class RequestHandle:
    """The asyncio end of one engine request: its outputs, in order, on a queue."""

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop):
        self.request_id = request_id
        self.loop = loop
        self.submitted = time.monotonic()
        self.final: RequestOutput | None = None
        self._queue: asyncio.Queue[RequestOutput] = asyncio.Queue()

    def _push(self, output: RequestOutput) -> None:  # runs on the event loop
        if self.final is not None:
            return
        if output.finished:
            self.final = output
        self._queue.put_nowait(output)

    async def outputs(self, timeout: float) -> AsyncIterator[RequestOutput]:
        """Partials then the final output; raises TimeoutError if the final is not there in ``timeout`` s."""
        deadline = self.loop.time() + timeout
        while True:
            remaining = deadline - self.loop.time()
            if remaining <= 0:
                raise TimeoutError(f"request {self.request_id} did not finish within {timeout:g} s")
            output = await asyncio.wait_for(self._queue.get(), remaining)
            yield output
            if output.finished:
                return

    async def result(self, timeout: float) -> RequestOutput:
        async for output in self.outputs(timeout):
            if output.finished:
                return output
        raise AssertionError("unreachable: outputs() ends with a finished output")


@attrs.define
class _Route:
    handle: RequestHandle
    last_partial: str | None = None


class EngineRunner:
    """Steps one :class:`Engine` on a dedicated thread and routes its outputs to request handles."""

    def __init__(self, engine: Engine, *, on_batch: Callable[[float], None] | None = None,
                 idle_interval: float = 0.1):
        self.engine = engine
        self.streaming = engine.config.service_mode == "streaming"
        self.on_batch = on_batch
        self.idle_interval = idle_interval
        # offline: re-check the scheduler often enough to honour its max_wait_time; streaming: feeds wake us
        wait = engine.config.max_wait_time / 2
        self.busy_interval = 0.02 if self.streaming else min(max(wait, 0.0005), 0.02)
        self.failure: str | None = None
        self.draining = False
        self.last_step = 0.0
        self._routes: dict[str, _Route] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._step_failures = 0

    # -- lifecycle -------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="oasr-engine", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    @property
    def ready(self) -> bool:
        return self.alive and not self.draining and self.failure is None

    @property
    def in_flight(self) -> int:
        with self._lock:
            return len(self._routes)

    def check_open(self) -> None:
        """Raise the 503 a new request gets when the runner cannot take it."""
        if self.failure is not None:
            raise unavailable(f"the engine failed and is not accepting requests: {self.failure}", code="engine_failed")
        if self.draining or not self.alive:
            raise unavailable("the server is shutting down", code="shutting_down")

    async def drain(self, grace: float) -> None:
        """Refuse new requests, give in-flight ones up to ``grace`` seconds, then stop."""
        self.draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while self.in_flight and loop.time() < deadline:
            await asyncio.sleep(0.05)
        if self.in_flight:
            logger.warning("shutdown grace of %g s elapsed; aborting %d request(s)", grace, self.in_flight)
        await asyncio.to_thread(self.stop)

    def stop(self) -> None:
        """Abort what is left (a running forward leaves its batch at the next module), answer every waiting
        handle, then stop the loop thread.  The answers go out first: a step that does not end promptly
        delays nobody's response, and the thread join is bounded."""
        self.draining = True
        self._stop.set()
        self._wake.set()
        try:
            self.engine.shutdown()
        except Exception:
            logger.exception("engine shutdown raised")
        with self._lock:
            leftover = list(self._routes)
        for request_id in leftover:
            self._deliver(RequestOutput(request_id, finished=True, finish_reason="abort",
                                        error="the server is shutting down"))
        if self._thread is not None:
            self._thread.join(timeout=STOP_JOIN_SECONDS)
            if self._thread.is_alive():
                logger.warning("the engine step did not end within %g s of the shutdown", STOP_JOIN_SECONDS)

    # -- requests --------------------------------------------------------------------------------------
    def _register(self) -> RequestHandle:
        handle = RequestHandle(uuid.uuid4().hex, asyncio.get_running_loop())
        with self._lock:
            self._routes[handle.request_id] = _Route(handle)
        return handle

    def _forget(self, request_id: str) -> None:
        with self._lock:
            self._routes.pop(request_id, None)

    async def _admit(self, handle: RequestHandle, fn: Callable[[], Any]) -> None:
        """Run an admission call in a worker thread; undo it if it fails or the caller goes away."""
        abandoned = threading.Event()
        token = DECODE_CANCELLED.set(abandoned)  # the worker thread's decode stops at its next block once set
        try:
            task = asyncio.ensure_future(asyncio.to_thread(fn))
        finally:
            DECODE_CANCELLED.reset(token)
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            abandoned.set()
            self._forget(handle.request_id)
            # the worker thread may still admit the request: abort it once it has
            task.add_done_callback(lambda t: t.cancelled() or t.exception() or self._abort_quietly(handle.request_id))
            raise
        except BaseException:
            self._forget(handle.request_id)
            raise
        self._wake.set()

    async def submit(self, audio: Any, *, sample_rate: int | None = None,
                     decoding: DecodingOptions | None = None) -> RequestHandle:
        """Admit a whole-audio request (bytes, path or array); admission errors raise here.

        A streaming engine gets the decoded audio as one stream fed at once, so its partials still
        arrive as the engine steps through it.
        """
        self.check_open()
        handle = self._register()
        if self.streaming:
            fn = lambda: self._submit_stream(handle.request_id, audio, sample_rate, decoding)  # noqa: E731
        else:
            fn = lambda: self.engine.add_request(audio, request_id=handle.request_id,  # noqa: E731
                                                 sample_rate=sample_rate, decoding=decoding, callback=self._deliver,
                                                 on_segments=self._partials(handle.request_id))
        await self._admit(handle, fn)
        return handle

    def _partials(self, request_id: str):
        """An offline request's ``on_segments``: each segment of a decoded window becomes a partial output
        (the text so far), so ``stream=true`` sends a delta per segment as windows finish."""
        pieces: list[str] = []

        def on_segments(segments, seconds_done: float, language: str | None) -> None:
            for segment in segments:
                pieces.append(segment.text)
                self._deliver(RequestOutput(request_id, text="".join(pieces).strip(), language=language))

        return on_segments

    def _submit_stream(self, request_id: str, audio: Any, sample_rate: int | None,
                       decoding: DecodingOptions | None) -> None:
        rate = self.engine.sample_rate
        samples = self.engine.load_audio(audio, sample_rate)
        self.engine.check_duration(len(samples) / rate, request_id)
        self.engine.add_streaming_request(request_id=request_id, sample_rate=rate, decoding=decoding,
                                          callback=self._deliver)
        try:
            self.engine.feed_chunk(request_id, samples, is_last=True)
        except BaseException:
            self._abort_quietly(request_id)
            raise

    async def open_stream(self, *, sample_rate: int, decoding: DecodingOptions | None = None) -> RequestHandle:
        """Open a stream on a streaming engine; feed it with :meth:`feed`."""
        self.check_open()
        handle = self._register()
        await self._admit(handle, lambda: self.engine.add_streaming_request(
            request_id=handle.request_id, sample_rate=sample_rate, decoding=decoding, callback=self._deliver))
        return handle

    async def feed(self, request_id: str, samples: Any, *, is_last: bool = False) -> None:
        await asyncio.to_thread(self.engine.feed_chunk, request_id, samples, is_last)
        self._wake.set()

    def abort(self, request_id: str) -> None:
        """Free a request whose client went away (no output is delivered for it any more)."""
        self._forget(request_id)
        self._abort_quietly(request_id)

    def _abort_quietly(self, request_id: str) -> None:
        try:
            self.engine.abort_request(request_id)
        except Exception:
            logger.exception("aborting request %s raised", request_id)

    # -- the loop thread -------------------------------------------------------------------------------
    def _deliver(self, output: RequestOutput) -> None:
        with self._lock:
            route = self._routes.get(output.request_id)
            if route is None:
                return
            if output.finished:
                del self._routes[output.request_id]
            elif output.text == route.last_partial:
                return
            else:
                route.last_partial = output.text
        try:
            route.handle.loop.call_soon_threadsafe(route.handle._push, output)
        except RuntimeError:  # the event loop is closed: nobody is waiting any more
            pass

    def _run(self) -> None:
        engine = self.engine
        while not self._stop.is_set():
            self._wake.clear()
            metrics = engine.metrics
            batches, batched = metrics.batches, metrics.batched_requests
            try:
                busy = engine.has_unfinished_requests()
                outputs = engine.step() if busy else []
                self._step_failures = 0
            except Exception as exc:
                self._on_step_error(exc)
                self._stop.wait(0.05)
                continue
            self.last_step = time.monotonic()
            for output in outputs:
                self._deliver(output)
            if self.on_batch is not None and metrics.batches > batches:
                self.on_batch((metrics.batched_requests - batched) / (metrics.batches - batches))
            if not outputs:
                self._wake.wait(self.busy_interval if busy else self.idle_interval)

    def _on_step_error(self, exc: Exception) -> None:
        """A step raised (a bug): fail the requests in flight rather than leave them waiting forever."""
        logger.exception("engine step failed", exc_info=exc)
        self._step_failures += 1
        message = f"internal error: the engine step failed: {type(exc).__name__}: {exc}"
        if self._step_failures >= MAX_STEP_FAILURES:
            self.failure = message
        with self._lock:
            pending = list(self._routes)
        for request_id in pending:  # deliver first: the abort's own output then finds no route
            self._deliver(RequestOutput(request_id, finished=True, finish_reason="error", error=message))
            self._abort_quietly(request_id)
