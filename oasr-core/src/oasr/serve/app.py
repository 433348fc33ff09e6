"""The FastAPI application: OpenAI's audio endpoints, models, health, readiness and metrics.

``create_app(engine_or_config, settings)`` builds one app around one engine.  Given an
:class:`~oasr.engine.EngineConfig`, the engine loads in a worker thread at startup (``/health`` answers
at once, ``/ready`` and the API answer 503 until it is loaded); given an :class:`~oasr.engine.Engine`,
it serves it as is.  The engine is stepped by one :class:`~oasr.serve.runner.EngineRunner` thread.

Routes:

- ``POST /v1/audio/transcriptions``, ``POST /v1/audio/translations``: OpenAI's multipart requests
  (see :mod:`oasr.serve.forms`); ``stream=true`` answers with server-sent events
  ``transcript.text.delta`` … ``transcript.text.done`` then ``data: [DONE]``.
- ``GET /v1/models``, ``GET /v1/models/{id}``; ``WS /v1/realtime`` (:mod:`oasr.serve.realtime`).
- ``GET /health`` (the process answers), ``GET /ready`` (engine loaded, loop thread stepping, not
  draining), ``GET /metrics`` (Prometheus text, :mod:`oasr.serve.metrics`).

Admission order for an audio request: API key (401), readiness (503), an upload slot (429, at most
``max_pending_uploads`` bodies being received), the body within ``body_timeout`` (408) and its size while
reading (413), fields (400), model name (404), then a concurrency slot (429: taken only once the body has
arrived, so slow uploads never hold one), audio decoding and model options at engine admission
(415 / 400).  Errors use OpenAI's shape (:mod:`oasr.serve.errors`).  A client that goes
away frees its request: the wait watches for the disconnect and aborts the engine request.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from oasr.engine import DecodingOptions, Engine, EngineConfig, RequestOutput
from oasr.engine.formats import render, verbose_json
from oasr.errors import AudioError, OasrError
from oasr.serve.errors import (
    ApiError,
    bad_request,
    from_failed_output,
    from_oasr_error,
    internal,
    overloaded,
    unavailable,
)
from oasr.serve.forms import AudioRequest, read_audio_request
from oasr.serve.metrics import ServerMetrics, outcome_of
from oasr.serve.runner import EngineRunner, RequestHandle
from oasr.serve.settings import ServerSettings

#: the page served at "/"
PAGE = Path(__file__).resolve().parent / "static" / "index.html"
logger = logging.getLogger("oasr.serve")


def error_response(err: ApiError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def served_name(model: str | None) -> str:
    """The name clients use for a model id: an alias or hub id as given, a local directory's name."""
    if model is None:
        from oasr.engine.engine import default_model

        return default_model()
    path = Path(model)
    return path.name if path.exists() else model


class ServerState:
    """Everything one app shares between requests (held as ``app.state.oasr``)."""

    def __init__(self, source: Engine | EngineConfig, settings: ServerSettings):
        self.settings = settings
        self.engine: Engine | None = source if isinstance(source, Engine) else None
        self.config: EngineConfig = source.config if isinstance(source, Engine) else source
        self.runner: EngineRunner | None = None
        self.load_error: str | None = None
        self.model_names: tuple[str, ...] = settings.served_model_names or (served_name(self.config.model),)
        self.created = int(time.time())
        self.in_flight = 0
        self.uploading = 0
        self.sessions: set[Any] = set()
        self.buffered_seconds = 0.0
        self.metrics = ServerMetrics(self._engine_snapshot)
        self._drain: asyncio.Task | None = None

    def _engine_snapshot(self) -> dict[str, Any] | None:
        return self.engine.metrics_snapshot() if self.engine is not None else None

    # -- lifecycle -------------------------------------------------------------------------------------
    def start_runner(self) -> None:
        assert self.engine is not None
        self.runner = EngineRunner(self.engine, on_batch=self.metrics.batch_size.observe)
        self.runner.start()

    async def load(self) -> None:
        try:
            self.engine = await asyncio.to_thread(Engine, self.config)
        except Exception as exc:  # reported by /ready and every request (503); the process stays up
            logger.exception("loading the model failed")
            self.load_error = f"{type(exc).__name__}: {exc}"
            return
        self.start_runner()

    async def drain(self) -> None:
        """Refuse new work, give in-flight requests ``shutdown_grace`` seconds, then end every one with its
        documented error shape while its connection is still open.  Idempotent."""
        if self._drain is None:
            self._drain = asyncio.ensure_future(self._drain_once())
        await asyncio.shield(self._drain)

    async def _drain_once(self) -> None:
        if self.runner is not None:
            await self.runner.drain(self.settings.shutdown_grace)
        for session in list(self.sessions):
            await session.shutdown()
        await asyncio.sleep(0.05)  # let the handlers woken by the aborts write their responses

    # -- per request -----------------------------------------------------------------------------------
    def authorize(self, headers: Any, *, token: str | None = None) -> None:
        key = self.settings.api_key
        if key is None:
            return
        if token is None:
            auth = headers.get("authorization")
            if not auth:
                raise ApiError(401, "no API key provided: send the header 'Authorization: Bearer <key>'",
                               code="invalid_api_key")
            scheme, _, token = auth.partition(" ")
            if scheme.lower() != "bearer":
                raise ApiError(401, f"unsupported authorization scheme {scheme!r}; send 'Authorization: Bearer <key>'",
                               code="invalid_api_key")
        if not hmac.compare_digest(token.strip().encode(), key.encode()):
            raise ApiError(401, "incorrect API key provided", code="invalid_api_key")

    def require_runner(self) -> EngineRunner:
        if self.runner is None:
            if self.load_error is not None:
                raise unavailable(f"the model failed to load: {self.load_error}", code="model_load_failed")
            raise unavailable("the model is still loading; retry shortly", code="model_loading")
        self.runner.check_open()
        return self.runner

    def check_model(self, model: str | None) -> None:
        if model is not None and model not in self.model_names:
            names = " ".join(self.model_names)
            raise ApiError(404, f"the model {model!r} does not exist on this server; it serves: "
                                f"{', '.join(self.model_names)}. To accept {model!r} too (OpenAI's examples send "
                                f"model=whisper-1), start it with --served-model-name {names} {model}",
                           param="model", code="model_not_found")

    async def read_upload(self, request: Request, task: str) -> AudioRequest:
        """The request's form, within the upload bound and the body deadline (429 / 408 / 413 / 400)."""
        settings = self.settings
        if self.uploading >= settings.max_pending_uploads:
            raise ApiError(429, f"the server is receiving {settings.max_pending_uploads} uploads already "
                                f"(--max-pending-uploads); retry later", type="rate_limit_error",
                           code="rate_limit_exceeded", headers={"Retry-After": "1"})
        self.uploading += 1
        try:
            async with asyncio.timeout(settings.body_timeout):
                return await read_audio_request(request, task=task, max_upload_bytes=settings.max_upload_bytes,
                                                max_body_bytes=settings.max_body_bytes)
        except TimeoutError:
            raise ApiError(408, f"the request body did not arrive within {settings.body_timeout:g} s "
                                f"(--body-timeout)", code="request_timeout", headers={"Connection": "close"}) from None
        finally:
            self.uploading -= 1

    def acquire(self) -> Callable[[], None]:
        """Take a concurrency slot (429 when none is free); returns its idempotent release."""
        if self.in_flight >= self.settings.max_concurrency:
            raise overloaded(self.settings.max_concurrency)
        self.in_flight += 1
        self.metrics.in_flight.set(self.in_flight)
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.in_flight -= 1
                self.metrics.in_flight.set(self.in_flight)

        return release

    def decoding_for(self, req: AudioRequest) -> DecodingOptions:
        kwargs: dict[str, Any] = {"task": req.task}
        if req.language:
            kwargs["language"] = req.language
        if req.prompt:
            kwargs["prompt"] = req.prompt
        if req.temperature:
            # OpenAI's temperature 0 (its default) means "raise the temperature on failure": the
            # model's own default schedule; another value is the one temperature to decode at
            kwargs["temperature"] = req.temperature
        if "word" in req.granularities:
            kwargs["word_timestamps"] = True
        if req.vad_filter:
            kwargs["vad_filter"] = True
        if req.batched:
            kwargs["batched"] = True
        # timed segments for every timed format (word timings are aligned within them, whatever is shown)
        if req.response_format in ("srt", "vtt", "verbose_json") and "timestamps" in self.engine.strategy.supported_options:
            kwargs["timestamps"] = True
        return DecodingOptions(**kwargs)


# -- audio endpoints -----------------------------------------------------------------------------------
async def _until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _wait(request: Request, runner: EngineRunner, handle: RequestHandle, timeout: float) -> RequestOutput | None:
    """The final output, or None if the client went away first (its request is then aborted)."""
    result = asyncio.ensure_future(handle.result(timeout))
    gone = asyncio.ensure_future(_until_disconnect(request))
    try:
        done, _ = await asyncio.wait({result, gone}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # the handler itself was cancelled (shutdown past its grace period)
        result.cancel()
        runner.abort(handle.request_id)
        raise
    finally:
        gone.cancel()
    if result in done:
        return result.result()
    result.cancel()
    runner.abort(handle.request_id)
    return None


def _outcome_error(output: RequestOutput) -> ApiError | None:
    if output.finish_reason == "error":
        return from_failed_output(output.error)
    if output.finish_reason == "abort":
        return unavailable(f"the request was aborted: {output.error or 'the server is shutting down'}",
                           code="aborted")
    return None


def usage_of(output: RequestOutput) -> dict[str, Any]:
    """OpenAI's usage object of a transcription billed by audio duration (its ``UsageDuration``)."""
    return {"type": "duration", "seconds": round(output.duration or 0.0, 3)}


def _render(output: RequestOutput, req: AudioRequest) -> Response:
    """The response body; a transcription's JSON formats carry ``usage`` (OpenAI's translation
    objects have none)."""
    if req.response_format == "verbose_json":
        body = verbose_json(output, task=req.task, include_words="word" in req.granularities,
                            include_segments=not req.granularities or "segment" in req.granularities)
        if not body["language"] and req.language:
            body["language"] = req.language
        if req.task == "transcribe":
            body["usage"] = usage_of(output)
        return JSONResponse(body)
    if req.response_format == "json":
        body = {"text": output.text, **({"usage": usage_of(output)} if req.task == "transcribe" else {})}
        return JSONResponse(body)
    return PlainTextResponse(render(output, req.response_format, task=req.task))


def _timeout_error(timeout: float) -> ApiError:
    return unavailable(f"the request did not finish within the server's request timeout ({timeout:g} s)",
                       code="timeout")


async def _audio_endpoint(request: Request, task: str) -> Response:
    state: ServerState = request.app.state.oasr
    endpoint = "transcriptions" if task == "transcribe" else "translations"
    started = time.perf_counter()
    release: Callable[[], None] | None = None
    handed_off = False
    try:
        state.authorize(request.headers)
        runner = state.require_runner()
        req = await state.read_upload(request, task)
        state.check_model(req.model)
        runner = state.require_runner()
        release = state.acquire()
        settings = state.settings
        try:
            decoding = state.decoding_for(req)
            handle = await runner.submit(req.audio, decoding=decoding)
        except AudioError as exc:
            named = AudioError(f"uploaded file {req.filename!r}: {exc}") if req.filename else exc
            raise from_oasr_error(named) from None
        except OasrError as exc:
            raise from_oasr_error(exc) from None
        if req.stream:
            stream = _TranscriptStream(state, runner, handle, endpoint, started, release)
            handed_off = True
            return _EventStreamResponse(stream)
        try:
            output = await _wait(request, runner, handle, settings.request_timeout)
        except TimeoutError:
            runner.abort(handle.request_id)
            state.metrics.finished(endpoint, "timeout")
            return error_response(_timeout_error(settings.request_timeout))
        if output is None:
            state.metrics.finished(endpoint, "disconnected")
            return Response(status_code=499)
        err = _outcome_error(output)
        if err is not None:
            raise err
        response = _render(output, req)
        state.metrics.finished(endpoint, "success", latency=time.perf_counter() - started,
                               audio_seconds=output.duration)
        return response
    except ApiError as err:
        state.metrics.finished(endpoint, outcome_of(err.status))
        return error_response(err)
    except ClientDisconnect:
        state.metrics.finished(endpoint, "disconnected")
        return Response(status_code=499)
    except Exception as exc:
        logger.exception("%s request failed", endpoint)
        state.metrics.finished(endpoint, "error")
        return error_response(internal(f"internal server error: {type(exc).__name__}: {exc}"))
    finally:
        if release is not None and not handed_off:
            release()


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def text_extension(sent: str, text: str) -> str:
    """What ``text`` adds to the already sent ``sent`` ('' when it revises it: deltas only append)."""
    return text[len(sent):] if text.startswith(sent) else ""


class _TranscriptStream:
    """The SSE body of a ``stream=true`` request; :meth:`close` (idempotent) frees everything."""

    def __init__(self, state: ServerState, runner: EngineRunner, handle: RequestHandle, endpoint: str,
                 started: float, release: Callable[[], None]):
        self.state, self.runner, self.handle = state, runner, handle
        self.endpoint, self.started, self.release = endpoint, started, release
        self.outcome = "disconnected"
        self.audio_seconds: float | None = None
        self.closed = False

    def _delta(self, delta: str, sent: str) -> str:
        if not sent:
            self.state.metrics.first_output.labels(self.endpoint).observe(time.perf_counter() - self.started)
        return _sse({"type": "transcript.text.delta", "delta": delta})

    async def events(self) -> AsyncIterator[str]:
        sent = ""
        try:
            async for output in self.handle.outputs(self.state.settings.request_timeout):
                if not output.finished:
                    delta = text_extension(sent, output.text)
                    if delta:
                        yield self._delta(delta, sent)
                        sent += delta
                    continue
                err = _outcome_error(output)
                if err is not None:
                    self.outcome = outcome_of(err.status)
                    yield _sse(err.body())
                else:
                    for delta in _final_deltas(sent, output):
                        yield self._delta(delta, sent)
                        sent += delta
                    yield _sse({"type": "transcript.text.done", "text": output.text})
                    self.outcome, self.audio_seconds = "success", output.duration
                yield "data: [DONE]\n\n"
        except TimeoutError:
            self.runner.abort(self.handle.request_id)
            self.outcome = "timeout"
            yield _sse(_timeout_error(self.state.settings.request_timeout).body())
            yield "data: [DONE]\n\n"
        finally:
            self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.handle.final is None:
            self.runner.abort(self.handle.request_id)
        self.release()
        self.state.metrics.finished(self.endpoint, self.outcome, latency=time.perf_counter() - self.started,
                                    audio_seconds=self.audio_seconds)


def _final_deltas(sent: str, output: RequestOutput) -> list[str]:
    """The deltas a final output still owes; with nothing sent yet, one per segment (they add up to the text)."""
    text = output.text
    if sent:
        rest = text_extension(sent, text)
        return [rest] if rest else []
    pieces, pos = [], 0
    for segment in output.segments or ():
        piece = segment.text.strip()
        found = text.find(piece, pos) if piece else -1
        if found < 0:
            break
        pieces.append(text[pos:found + len(piece)])
        pos = found + len(piece)
    pieces.append(text[pos:])
    return [p for p in pieces if p]


class _EventStreamResponse(StreamingResponse):
    """SSE response that frees its request even if the body never started (early disconnect)."""

    def __init__(self, stream: _TranscriptStream):
        super().__init__(stream.events(), media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._stream = stream

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._stream.close()


# -- the app -------------------------------------------------------------------------------------------
def create_app(engine: Engine | EngineConfig, settings: ServerSettings | None = None) -> FastAPI:
    """The server app around one engine (or the config to load one at startup)."""
    from oasr.serve.realtime import realtime_endpoint

    state = ServerState(engine, settings or ServerSettings())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loading = None
        if state.engine is None:
            loading = asyncio.create_task(state.load())
        else:
            state.start_runner()
        try:
            yield
        finally:
            if loading is not None and not loading.done():
                await asyncio.wait({loading}, timeout=state.settings.shutdown_grace)
            await state.drain()

    app = FastAPI(title="OASR", summary="OpenAI-compatible speech recognition", lifespan=lifespan,
                  docs_url="/docs", redoc_url=None)
    app.state.oasr = state

    @app.get("/", include_in_schema=False)
    async def _page() -> HTMLResponse:
        """The browser page: upload a file or speak (static/index.html; it calls the API itself)."""
        return HTMLResponse(PAGE.read_text(encoding="utf-8"))

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        message = f"{exc.detail}: {request.method} {request.url.path}" if exc.status_code in (404, 405) else str(exc.detail)
        return error_response(ApiError(exc.status_code, message, code=code))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return error_response(bad_request(f"invalid request: {first.get('msg', exc)}", param=param))

    @app.post("/v1/audio/transcriptions")
    async def transcriptions(request: Request) -> Response:
        return await _audio_endpoint(request, "transcribe")

    @app.post("/v1/audio/translations")
    async def translations(request: Request) -> Response:
        return await _audio_endpoint(request, "translate")

    def model_card(name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": state.created, "owned_by": "oasr"}

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        state.authorize(request.headers)
        return JSONResponse({"object": "list", "data": [model_card(n) for n in state.model_names]})

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, request: Request) -> JSONResponse:
        state.authorize(request.headers)
        state.check_model(model_id)
        return JSONResponse(model_card(model_id))

    @app.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    @app.get("/ready")
    async def ready() -> JSONResponse:
        runner = state.runner
        if runner is not None and runner.ready:
            return JSONResponse({"status": "ready", "models": list(state.model_names),
                                 "service_mode": state.config.service_mode, "in_flight": state.in_flight})
        if state.load_error is not None:
            status, detail = "failed", f"the model failed to load: {state.load_error}"
        elif runner is None:
            status, detail = "loading", "the model is loading"
        elif runner.failure is not None:
            status, detail = "failed", runner.failure
        else:
            status, detail = "draining", "the server is shutting down"
        return JSONResponse({"status": status, "detail": detail}, status_code=503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    app.add_api_websocket_route("/v1/realtime", realtime_endpoint)
    return app
