"""``WS /v1/realtime``: OpenAI's realtime transcription events over one WebSocket.

Client events:

- ``session.update`` (GA shape: ``session.type = "transcription"``, ``session.audio.input.format``
  ``{"type": "audio/pcm", "rate": 24000 | 16000}``, ``session.audio.input.transcription``
  ``{model, language, prompt}``) or ``transcription_session.update`` (beta shape:
  ``input_audio_format = "pcm16"`` (24 kHz), ``input_audio_transcription``);
- ``input_audio_buffer.append`` ``{audio: base64 of PCM16 little-endian mono}``;
- ``input_audio_buffer.commit`` and ``input_audio_buffer.clear``.

Server events: ``session.created``, ``session.updated`` / ``transcription_session.updated``,
``input_audio_buffer.committed``, ``input_audio_buffer.cleared``,
``conversation.item.input_audio_transcription.delta`` / ``.completed`` / ``.failed``, and ``error``
(the session stays open after an error).

A natively streaming engine (``service_mode="streaming"``) gets each item as an engine stream: the
first append opens it, every append feeds it, and partial results become delta events while audio
is still arriving (they carry the item id that ``input_audio_buffer.committed`` announces later);
commit ends the stream and its final result is the completed event.  An offline engine accumulates
the appended audio as PCM16 (up to ``realtime_max_buffer_seconds`` per item, and
``realtime_max_total_buffer_seconds`` over all sessions) and transcribes it at commit; a session opened
with ``?partials=true`` also gets ``oasr.input_audio_transcription.partial`` events while it buffers
(``transcript``: the text of the buffer so far, replacing the previous partial; the buffer is transcribed
again after every ``realtime_partial_seconds`` of new audio, one such preview at a time, up to
:data:`PARTIAL_MAX_SECONDS` of buffer, never holding the concurrency slot a commit needs).  The engine
resamples 24 kHz input to the model's rate.  ``turn_detection: {"type": "server_vad", ...}`` makes the
server find turns and commit them itself (see :mod:`oasr.serve.turns`); otherwise ``turn_detection`` must be
null and the client commits.  Every item in transcription holds one concurrency slot.

A malformed event (invalid JSON, nesting too deep, an integer too long to parse, a string that is not
valid Unicode, an unexpected failure while handling it) is answered with an ``error`` event and the
session stays open; every string the server echoes is encoded safely.  At most
``realtime_max_sessions`` sessions are open at once (the next handshake gets 429).  On shutdown an item
still buffering gets an ``error`` event and one in transcription its ``failed`` event before the close.

Authentication, when the server has an API key: ``Authorization: Bearer <key>`` or the subprotocol
``openai-insecure-api-key.<key>``; a bad key or an unknown ``?model=`` refuses the handshake (401 /
404 with OpenAI's error body).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import attrs
import numpy as np
from starlette.responses import JSONResponse
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from oasr.engine import DecodingOptions, RequestOutput
from oasr.errors import OasrError
from oasr.serve.errors import ApiError, from_failed_output, from_oasr_error, unavailable
from oasr.serve.metrics import outcome_of
from oasr.serve.runner import RequestHandle
from oasr.serve.turns import TurnConfigError, TurnTaker, observe_turn_latency, parse_turn_detection

logger = logging.getLogger("oasr.serve")

RATES = (24000, 16000)
KEY_SUBPROTOCOL = "openai-insecure-api-key."
ENDPOINT = "realtime"
TRANSCRIPTION_KEYS = ("model", "language", "prompt")
#: on shutdown, how long items in transcription get to send their final event
SHUTDOWN_FLUSH_SECONDS = 1.0
#: offline partials stop once a buffer holds this much audio (each preview transcribes the whole buffer)
PARTIAL_MAX_SECONDS = 120.0
PARTIAL_EVENT = "oasr.input_audio_transcription.partial"


class EventError(Exception):
    """A client event refused with an ``error`` event; the session continues."""

    def __init__(self, message: str, *, code: str, param: str | None = None, type: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.code, self.param, self.type = message, code, param, type


def _event_id() -> str:
    return f"event_{uuid.uuid4().hex[:20]}"


def _encodable(value: Any) -> bool:
    """A string that can be sent as UTF-8 (no lone surrogates)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _dumps(payload: dict[str, Any]) -> str:
    text = json.dumps(payload, ensure_ascii=False)
    return text if _encodable(text) else json.dumps(payload, ensure_ascii=True)  # escapes lone surrogates


@attrs.define(eq=False)
class _Item:
    """One input audio item: the buffer being appended to, then its transcription."""

    item_id: str
    rate: int
    decoding: DecodingOptions
    chunks: list[np.ndarray] = attrs.field(factory=list)  # int16 PCM, offline engines only
    samples: int = 0
    #: seconds of ``chunks`` counted in the server-wide realtime buffer total
    buffered: float = 0.0
    first_append: float = attrs.field(factory=time.perf_counter)
    handle: RequestHandle | None = None
    task: asyncio.Task | None = None
    release: Callable[[], None] | None = None
    outcome: str = "disconnected"
    #: server VAD: when the turn's speech stopped (perf_counter)
    stopped: float | None = None
    #: offline partials: the preview transcription running, and the buffer length it started at
    preview: asyncio.Task | None = None
    previewed: int = 0

    @property
    def seconds(self) -> float:
        return self.samples / self.rate


class RealtimeSession:
    def __init__(self, websocket: WebSocket, state: Any, *, partials: bool = False):
        self.ws = websocket
        self.partials = partials
        self.state = state
        self.runner = state.runner
        self.id = f"sess_{uuid.uuid4().hex[:20]}"
        self.rate = RATES[0]
        self.transcription: dict[str, str | None] = {"model": state.model_names[0], "language": None, "prompt": None}
        self.current: _Item | None = None
        self.previous_item_id: str | None = None
        self.items: set[_Item] = set()
        self.turns: TurnTaker | None = None
        self._send_lock = asyncio.Lock()
        self._open = True

    # -- sending ---------------------------------------------------------------------------------------
    async def send(self, type: str, **fields: Any) -> None:
        if not self._open:
            return
        payload = _dumps({"type": type, "event_id": _event_id(), **fields})
        try:
            async with self._send_lock:
                await self.ws.send_text(payload)
        except (WebSocketDisconnect, RuntimeError, OSError):
            self._open = False

    async def send_error(self, err: EventError, client_event_id: str | None = None) -> None:
        await self.send("error", error={"type": err.type, "code": err.code, "message": err.message,
                                        "param": err.param, "event_id": client_event_id})

    def describe(self) -> dict[str, Any]:
        return {"id": self.id, "object": "realtime.transcription_session", "type": "transcription",
                "audio": {"input": {"format": {"type": "audio/pcm", "rate": self.rate},
                                    "transcription": dict(self.transcription), "turn_detection": self._turn_detection(),
                                    "noise_reduction": None}},
                "include": []}

    def describe_beta(self) -> dict[str, Any]:
        return {"id": self.id, "object": "realtime.transcription_session", "input_audio_format": "pcm16",
                "input_audio_transcription": dict(self.transcription), "turn_detection": self._turn_detection(),
                "input_audio_noise_reduction": None, "include": []}

    # -- the session loop ------------------------------------------------------------------------------
    async def run(self) -> None:
        await self.send("session.created", session=self.describe())
        while self._open:
            message = await self.ws.receive()
            if message["type"] == "websocket.disconnect":
                break
            event_id = None
            try:
                if message.get("text") is None:
                    raise EventError("binary frames are not supported; send JSON text events", code="invalid_event")
                try:
                    event = json.loads(message["text"])
                except (ValueError, RecursionError) as exc:  # JSONDecodeError, too many digits, too deep
                    raise EventError(f"the event is not valid JSON: {type(exc).__name__}: {str(exc)[:200]}",
                                     code="invalid_json") from None
                if not isinstance(event, dict) or not isinstance(event.get("type"), str):
                    raise EventError("an event must be a JSON object with a string 'type'", code="invalid_event",
                                     param="type")
                event_id = event.get("event_id")
                event_id = event_id[:512] if isinstance(event_id, str) else None
                await self.handle(event)
            except EventError as err:
                await self.send_error(err, event_id)
            except Exception as exc:  # a bug while handling one event must not end the session
                logger.exception("realtime event handling failed")
                await self.send_error(EventError(f"internal error while handling the event: {type(exc).__name__}",
                                                 code="server_error", type="server_error"), event_id)

    async def handle(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "input_audio_buffer.append":
            await self.append(event.get("audio"))
        elif kind == "input_audio_buffer.commit":
            await self.commit()
        elif kind == "input_audio_buffer.clear":
            self.clear()
            await self.send("input_audio_buffer.cleared")
        elif kind == "session.update":
            self.update(self._parse_ga(event.get("session")))
            await self.send("session.updated", session=self.describe())
        elif kind == "transcription_session.update":
            self.update(self._parse_beta(event.get("session")))
            await self.send("transcription_session.updated", session=self.describe_beta())
        else:
            raise EventError(f"unsupported event type {kind!r}; this transcription endpoint takes session.update, "
                             f"transcription_session.update and input_audio_buffer.append/commit/clear",
                             code="unknown_event", param="type")

    # -- session configuration -------------------------------------------------------------------------
    @staticmethod
    def _object(value: Any, param: str) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise EventError(f"'{param}' must be an object", code="invalid_value", param=param)
        return value

    @staticmethod
    def _refuse_set(values: dict[str, Any], keys: tuple[str, ...], prefix: str) -> None:
        for key in keys:
            if values.get(key) not in (None, [], {}):
                raise EventError(f"'{prefix}{key}' is not supported by this server; leave it null (there is no "
                                 f"server VAD or noise reduction: the client commits the buffer)",
                                 code="unsupported_value", param=prefix + key)

    def _parse_transcription(self, value: Any, param: str) -> dict[str, Any]:
        config = self._object(value, param)
        unknown = sorted(set(config) - set(TRANSCRIPTION_KEYS))
        if unknown:
            raise EventError(f"unsupported key(s) {', '.join(unknown)} in '{param}'; supported: "
                             f"{', '.join(TRANSCRIPTION_KEYS)}", code="unknown_parameter", param=f"{param}.{unknown[0]}")
        for key, item in config.items():
            if item is not None and not (isinstance(item, str) and _encodable(item)):
                raise EventError(f"'{param}.{key}' must be a string of valid Unicode text", code="invalid_value",
                                 param=f"{param}.{key}")
        model = config.get("model")
        if model and model not in self.state.model_names:
            raise EventError(f"the model {model!r} does not exist on this server; it serves: "
                             f"{', '.join(self.state.model_names)}", code="model_not_found", param=f"{param}.model")
        return {k: (v or None) for k, v in config.items()}

    def _parse_ga(self, value: Any) -> dict[str, Any]:
        session = self._object(value, "session")
        if session.get("type", "transcription") != "transcription":
            raise EventError(f"this server runs transcription sessions only; got session.type "
                             f"{session.get('type')!r}", code="invalid_value", param="session.type")
        known = ("type", "audio", "include", "id", "object")
        unknown = sorted(set(session) - set(known))
        if unknown:
            raise EventError(f"unsupported key(s) {', '.join(unknown)} in 'session'", code="unknown_parameter",
                             param=f"session.{unknown[0]}")
        self._refuse_set(session, ("include",), "session.")
        audio_input = self._object(self._object(session.get("audio"), "session.audio").get("input"),
                                   "session.audio.input")
        self._refuse_set(audio_input, ("noise_reduction",), "session.audio.input.")
        patch: dict[str, Any] = self._parse_turns(audio_input, "session.audio.input.")
        if "format" in audio_input:
            fmt = self._object(audio_input["format"], "session.audio.input.format")
            if fmt.get("type", "audio/pcm") != "audio/pcm" or fmt.get("rate", RATES[0]) not in RATES:
                raise EventError(f"input audio must be audio/pcm (PCM16) at 24000 or 16000 Hz, got {fmt}",
                                 code="invalid_value", param="session.audio.input.format")
            patch["rate"] = int(fmt.get("rate", RATES[0]))
        if "transcription" in audio_input:
            patch["transcription"] = self._parse_transcription(audio_input["transcription"],
                                                               "session.audio.input.transcription")
        return patch

    def _parse_beta(self, value: Any) -> dict[str, Any]:
        session = self._object(value, "session")
        known = ("input_audio_format", "input_audio_transcription", "turn_detection", "input_audio_noise_reduction",
                 "include", "modalities")
        unknown = sorted(set(session) - set(known))
        if unknown:
            raise EventError(f"unsupported key(s) {', '.join(unknown)} in 'session'", code="unknown_parameter",
                             param=f"session.{unknown[0]}")
        self._refuse_set(session, ("input_audio_noise_reduction", "include"), "session.")
        patch: dict[str, Any] = self._parse_turns(session, "session.")
        if "input_audio_format" in session:
            if session["input_audio_format"] != "pcm16":
                raise EventError(f"input_audio_format must be 'pcm16' (24 kHz), got {session['input_audio_format']!r}",
                                 code="invalid_value", param="session.input_audio_format")
            patch["rate"] = RATES[0]
        if "input_audio_transcription" in session:
            patch["transcription"] = self._parse_transcription(session["input_audio_transcription"],
                                                               "session.input_audio_transcription")
        return patch

    def update(self, patch: dict[str, Any]) -> None:
        """Apply a validated update; the item being appended keeps the settings it started with."""
        rate_changed = patch.get("rate", self.rate) != self.rate
        self.rate = patch.get("rate", self.rate)
        if "turn_detection" in patch or (rate_changed and self.turns is not None):
            config = patch["turn_detection"] if "turn_detection" in patch else self.turns.config
            self.turns = self._turn_taker(config)
        for key, value in patch.get("transcription", {}).items():
            self.transcription[key] = value
        if not self.transcription["model"]:
            self.transcription["model"] = self.state.model_names[0]

    # -- server VAD (oasr.serve.turns) -----------------------------------------------------------------
    def _parse_turns(self, section: dict[str, Any], prefix: str) -> dict[str, Any]:
        if "turn_detection" not in section:
            return {}
        try:
            return {"turn_detection": parse_turn_detection(section["turn_detection"])}
        except TurnConfigError as exc:
            param = f"{prefix}turn_detection" + (f".{exc.key}" if exc.key else "")
            raise EventError(str(exc), code="invalid_value", param=param) from None

    def _turn_taker(self, config) -> TurnTaker | None:
        if config is None:
            return None
        try:
            return TurnTaker(config, self.rate, self._append_samples, self.commit, self.send, lambda: self.current)
        except OasrError as exc:  # the VAD is not installed
            raise EventError(f"server VAD is unavailable: {exc}", code="unsupported_value",
                             param="turn_detection") from None

    def _turn_detection(self) -> dict[str, Any] | None:
        return self.turns.config.describe() if self.turns is not None else None

    def _decoding(self) -> DecodingOptions:
        kwargs = {k: v for k in ("language", "prompt") if (v := self.transcription.get(k))}
        return DecodingOptions(**kwargs)

    # -- the input buffer ------------------------------------------------------------------------------
    @staticmethod
    def _pcm16(audio: Any) -> np.ndarray:
        if not isinstance(audio, str):
            raise EventError("'audio' must be a base64 string of PCM16 samples", code="invalid_value", param="audio")
        try:
            raw = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise EventError(f"'audio' is not valid base64: {exc}", code="invalid_value", param="audio") from None
        if len(raw) % 2:
            raise EventError(f"'audio' must hold whole 16-bit samples, got {len(raw)} bytes", code="invalid_value",
                             param="audio")
        return np.frombuffer(raw, dtype="<i2")

    async def _start_item(self) -> _Item:
        item = _Item(f"item_{uuid.uuid4().hex[:20]}", self.rate, self._decoding())
        if self.runner.streaming:
            item.release = self._acquire()
            try:
                item.handle = await self.runner.open_stream(sample_rate=item.rate, decoding=item.decoding)
            except BaseException as exc:
                item.release()
                if isinstance(exc, OasrError):
                    err = from_oasr_error(exc)
                    raise EventError(err.message, code=err.code or "invalid_request", param=err.param) from None
                raise
            self.items.add(item)
            item.task = asyncio.create_task(self._forward(item))
        return item

    def _acquire(self) -> Callable[[], None]:
        try:
            self.runner.check_open()
            return self.state.acquire()
        except ApiError as err:
            self.state.metrics.finished(ENDPOINT, outcome_of(err.status))
            raise EventError(err.message, code=err.code or "unavailable", type=err.type) from None

    async def append(self, audio: Any) -> None:
        samples = self._pcm16(audio)
        if not len(samples):
            return
        if self.turns is not None:
            await self.turns.push(samples)
            return
        await self._append_samples(samples)

    async def _append_samples(self, samples: np.ndarray) -> None:
        item = self.current
        if item is not None and item.handle is not None and item.handle.final is not None:
            item = self.current = None  # the engine already ended that stream (length limit): start afresh
        limit = self.state.settings.realtime_max_buffer_seconds
        if item is not None and item.samples + len(samples) > limit * item.rate:
            raise EventError(f"the input audio buffer would exceed {limit:g} s; commit it first",
                             code="input_audio_buffer_full", param="audio")
        seconds = len(samples) / (item.rate if item is not None else self.rate)
        total = self.state.settings.realtime_max_total_buffer_seconds
        if not self.runner.streaming and self.state.buffered_seconds + seconds > total:
            raise EventError(f"the server's realtime buffers are full ({total:g} s of uncommitted audio over all "
                             f"sessions); commit or clear this buffer, or retry later", code="server_buffers_full",
                             param="audio", type="server_error")
        if item is None:
            item = self.current = await self._start_item()
        item.samples += len(samples)
        if item.handle is not None:
            try:
                await self.runner.feed(item.handle.request_id, samples)
            except OasrError as exc:
                raise EventError(f"the audio could not be fed: {exc}", code="invalid_audio", param="audio") from None
        else:
            item.chunks.append(samples)
            item.buffered += seconds
            self.state.buffered_seconds += seconds
            self._maybe_preview(item)

    def _maybe_preview(self, item: _Item) -> None:
        """Start a preview transcription of the buffer so far, when partials are asked for and enough new
        audio has arrived since the last one (never two at once for an item)."""
        every = self.state.settings.realtime_partial_seconds
        if not self.partials or every <= 0 or item.preview is not None or item.seconds > PARTIAL_MAX_SECONDS:
            return
        if item.samples - item.previewed < every * item.rate:
            return
        item.previewed = item.samples
        item.preview = asyncio.create_task(self._preview(item))

    async def _preview(self, item: _Item) -> None:
        """Transcribe the buffer so far and send it as a partial while the item is still buffering; skipped
        when no concurrency slot is free (a preview never waits for one)."""
        handle, release = None, None
        try:
            try:
                release = self.state.acquire()
            except ApiError:
                return
            audio = np.concatenate(item.chunks).astype(np.float32) / 32768.0
            handle = await self.runner.submit(audio, sample_rate=item.rate, decoding=item.decoding)
            output = await handle.result(self._timeout())
            if self.current is item and output.finish_reason not in ("error", "abort"):
                await self.send(PARTIAL_EVENT, item_id=item.item_id, content_index=0, transcript=output.text)
        except (OasrError, ApiError, TimeoutError):
            pass  # a preview that fails is not shown; the commit reports the item's own outcome
        finally:
            if handle is not None and handle.final is None:
                self.runner.abort(handle.request_id)
            if release is not None:
                release()
            item.preview = None

    @staticmethod
    def _stop_preview(item: _Item) -> None:
        if item.preview is not None:
            item.preview.cancel()

    async def commit(self) -> None:
        item = self.current
        if item is None or item.samples == 0:
            raise EventError("the input audio buffer is empty: append audio before committing",
                             code="input_audio_buffer_commit_empty")
        self.current = None
        self._stop_preview(item)
        await self.send("input_audio_buffer.committed", item_id=item.item_id, previous_item_id=self.previous_item_id)
        self.previous_item_id = item.item_id
        if item.handle is not None:
            if item.handle.final is None:
                try:
                    await self.runner.feed(item.handle.request_id, np.zeros(0, dtype=np.float32), is_last=True)
                except OasrError as exc:
                    await self._failed(item, EventError(str(exc), code="invalid_audio"))
        else:
            self.items.add(item)
            item.task = asyncio.create_task(self._transcribe(item))

    def clear(self) -> None:
        if self.turns is not None:
            self.turns = self._turn_taker(self.turns.config)
        item, self.current = self.current, None
        if item is not None:
            self._drop(item)

    def _unbuffer(self, item: _Item) -> None:
        self.state.buffered_seconds = max(0.0, self.state.buffered_seconds - item.buffered)
        item.buffered = 0.0

    def _drop(self, item: _Item) -> None:
        self._stop_preview(item)
        if item.task is not None:
            item.task.cancel()
        if item.handle is not None and item.handle.final is None:
            self.runner.abort(item.handle.request_id)
        self._done(item)

    def _done(self, item: _Item) -> None:
        self._unbuffer(item)
        if item.release is not None:
            item.release()
            item.release = None
            self.state.metrics.finished(ENDPOINT, item.outcome, latency=time.perf_counter() - item.first_append,
                                        audio_seconds=item.seconds if item.outcome == "success" else None)
        self.items.discard(item)

    # -- results ---------------------------------------------------------------------------------------
    async def _failed(self, item: _Item, err: EventError) -> None:
        item.outcome = "bad_request" if err.type == "invalid_request_error" else "error"
        await self.send("conversation.item.input_audio_transcription.failed", item_id=item.item_id, content_index=0,
                        error={"type": err.type, "code": err.code, "message": err.message, "param": err.param})

    async def _finish(self, item: _Item, output: RequestOutput, sent: str) -> None:
        if output.finish_reason in ("error", "abort"):
            err = (from_failed_output(output.error) if output.finish_reason == "error"
                   else unavailable(f"the transcription was aborted: {output.error or 'the server is shutting down'}"))
            await self._failed(item, EventError(err.message, code=err.code or "failed", type=err.type))
            return
        await self._delta(item, output.text, sent)
        await self.send("conversation.item.input_audio_transcription.completed", item_id=item.item_id,
                        content_index=0, transcript=output.text,
                        usage={"type": "duration", "seconds": round(output.duration or item.seconds, 3)})
        item.outcome = "success"
        if item.stopped is not None:
            observe_turn_latency(self.state.metrics, time.perf_counter() - item.stopped)

    async def _delta(self, item: _Item, text: str, sent: str) -> str:
        delta = text[len(sent):] if text.startswith(sent) else ""
        if delta:
            if not sent:
                self.state.metrics.first_output.labels(ENDPOINT).observe(time.perf_counter() - item.first_append)
            await self.send("conversation.item.input_audio_transcription.delta", item_id=item.item_id,
                            content_index=0, delta=delta)
        return sent + delta

    def _timeout(self) -> float:
        return self.state.settings.request_timeout + self.state.settings.realtime_max_buffer_seconds

    async def _forward(self, item: _Item) -> None:
        """Streaming engines: partials → delta events, the final → completed (or failed)."""
        sent = ""
        try:
            async for output in item.handle.outputs(self._timeout()):
                if output.finished:
                    await self._finish(item, output, sent)
                else:
                    sent = await self._delta(item, output.text, sent)
        except TimeoutError:
            self.runner.abort(item.handle.request_id)
            item.outcome = "timeout"
            await self._failed(item, EventError("the transcription did not finish in time", code="timeout",
                                                type="server_error"))
        finally:
            self._done(item)

    async def _transcribe(self, item: _Item) -> None:
        """Offline engines: transcribe a committed buffer as one request."""
        handle = None
        try:
            item.release = self._acquire()
            audio = np.concatenate(item.chunks).astype(np.float32) / 32768.0
            item.chunks.clear()
            self._unbuffer(item)
            handle = item.handle = await self.runner.submit(audio, sample_rate=item.rate, decoding=item.decoding)
            output = await handle.result(self.state.settings.request_timeout)
            await self._finish(item, output, "")
        except EventError as err:
            await self._failed(item, err)
        except (OasrError, ApiError) as exc:
            err = from_oasr_error(exc) if isinstance(exc, OasrError) else exc
            await self._failed(item, EventError(err.message, code=err.code or "invalid_request", param=err.param,
                                                type=err.type))
        except TimeoutError:
            self.runner.abort(handle.request_id)
            item.outcome = "timeout"
            await self._failed(item, EventError("the transcription did not finish in time", code="timeout",
                                                type="server_error"))
        finally:
            self._done(item)

    async def shutdown(self) -> None:
        """The server is stopping: tell the client about a buffering item, let items in transcription send
        their final event (the runner has aborted them), then stop sending."""
        if self.current is not None and self.current.handle is None and self.current.samples:
            await self.send("error", error={"type": "server_error", "code": "shutting_down", "param": None,
                                            "event_id": None, "message": "the server is shutting down; the "
                                            "uncommitted input audio buffer was discarded"})
        tasks = [item.task for item in self.items if item.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=SHUTDOWN_FLUSH_SECONDS)
        await self.close()

    async def close(self) -> None:
        self._open = False
        if self.current is not None:
            self._drop(self.current)
            self.current = None
        for item in list(self.items):
            self._drop(item)


def _subprotocol_key(websocket: WebSocket) -> tuple[str | None, str | None]:
    """(API key passed as a subprotocol, the subprotocol to accept)."""
    offered = websocket.scope.get("subprotocols") or []
    key = next((p[len(KEY_SUBPROTOCOL):] for p in offered if p.startswith(KEY_SUBPROTOCOL)), None)
    accept = "realtime" if "realtime" in offered else None
    return key, accept


async def realtime_endpoint(websocket: WebSocket) -> None:
    state = websocket.app.state.oasr
    key, subprotocol = _subprotocol_key(websocket)
    try:
        if key is not None and websocket.headers.get("authorization") is None:
            state.authorize(websocket.headers, token=key)
        else:
            state.authorize(websocket.headers)
        state.check_model(websocket.query_params.get("model"))
        state.require_runner()
        if len(state.sessions) >= state.settings.realtime_max_sessions:
            raise ApiError(429, f"the server has {state.settings.realtime_max_sessions} realtime sessions open "
                                f"(realtime_max_sessions); retry later", type="rate_limit_error",
                           code="rate_limit_exceeded", headers={"Retry-After": "1"})
    except ApiError as err:
        state.metrics.finished(ENDPOINT, outcome_of(err.status))
        if "websocket.http.response" in websocket.scope.get("extensions", {}):
            await websocket.send_denial_response(JSONResponse(err.body(), status_code=err.status, headers=err.headers))
        else:  # a server without the denial-response extension: refuse with a policy-violation close
            await websocket.close(code=1008, reason=err.message[:120])
        return
    await websocket.accept(subprotocol=subprotocol)
    partials = websocket.query_params.get("partials", "").strip().lower() in ("1", "true", "yes")
    session = RealtimeSession(websocket, state, partials=partials)
    state.sessions.add(session)
    state.metrics.realtime_sessions.inc()
    try:
        await session.run()
    except WebSocketDisconnect:
        pass
    finally:
        await session.close()
        state.sessions.discard(session)
        state.metrics.realtime_sessions.dec()
        if websocket.client_state == WebSocketState.CONNECTED:
            try:
                await websocket.close()
            except RuntimeError:
                pass
