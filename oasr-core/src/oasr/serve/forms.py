"""Reading an OpenAI audio request: a bounded multipart body into a validated :class:`AudioRequest`.

The size limit holds while the body is read (the declared Content-Length is checked first, then the
bytes actually received are counted), so an oversized upload is refused with 413 without being
buffered.  Every field is checked for its type and value; an unknown field is refused, not ignored.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import Request

from oasr.engine.formats import FORMATS
from oasr.serve.errors import ApiError, bad_request

GRANULARITIES = ("segment", "word")
TRUE, FALSE = ("true", "1", "yes"), ("false", "0", "no", "")

#: fields of OpenAI's create-transcription and create-translation requests this server honours
#: (``language`` on translations is an extension: the spoken language, when the client knows it;
#: so is ``vad_filter``: decode only the speech a voice activity detector finds, as faster-whisper, and
#: ``batched``: faster-whisper's BatchedInferencePipeline long-form, where the decode method offers it)
FIELDS = {
    "transcribe": ("file", "model", "language", "prompt", "response_format", "temperature",
                   "timestamp_granularities[]", "timestamp_granularities", "stream", "vad_filter", "batched"),
    "translate": ("file", "model", "language", "prompt", "response_format", "temperature", "vad_filter"),
}
#: the most text one non-file field may carry
MAX_FIELD_BYTES = 64 * 1024


@attrs.define(kw_only=True)
class AudioRequest:
    task: str
    audio: bytes
    #: the upload's file name as the client sent it (for messages only)
    filename: str = ""
    model: str | None = None
    language: str | None = None
    prompt: str | None = None
    response_format: str = "json"
    temperature: float | None = None
    granularities: tuple[str, ...] = ()
    stream: bool = False
    vad_filter: bool = False
    batched: bool = False


class UploadTooLarge(Exception):
    pass


def too_large(limit: int) -> ApiError:
    return ApiError(413, f"the upload is larger than this server's limit of {limit / 2**20:g} MiB "
                         f"(--max-upload-mb)", param="file", code="file_too_large")


def _limited(receive: Callable[[], Awaitable[dict]], limit: int) -> Callable[[], Awaitable[dict]]:
    received = 0

    async def limited_receive() -> dict:
        nonlocal received
        message = await receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > limit:
                raise UploadTooLarge(received)
        return message

    return limited_receive


def _text(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise bad_request(f"field '{name}' must be a text field, got a file upload", param=name)
    return value


def _number(name: str, value: str, low: float, high: float) -> float:
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not (low <= number <= high):  # also refuses nan
        raise bad_request(f"field '{name}' must be a number between {low:g} and {high:g}, got {value!r}", param=name)
    return number


def _boolean(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in TRUE:
        return True
    if lowered in FALSE:
        return False
    raise bad_request(f"field '{name}' must be true or false, got {value!r}", param=name)


async def read_audio_request(request: Request, *, task: str, max_upload_bytes: int,
                             max_body_bytes: int) -> AudioRequest:
    """Parse and validate the multipart body of an audio request (raises ApiError)."""
    content_type = request.headers.get("content-type", "")
    if not content_type.lower().startswith("multipart/form-data"):
        raise bad_request(f"expected a multipart/form-data body (as OpenAI's audio API takes), got "
                          f"Content-Type {content_type or '(none)'!r}")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
        raise too_large(max_upload_bytes)
    limited = Request(request.scope, _limited(request.receive, max_body_bytes))
    try:
        # two files: so that a text field sent as a file is reported by name below, not as "too many files"
        form = await limited.form(max_files=2, max_fields=len(FIELDS[task]) + 4, max_part_size=MAX_FIELD_BYTES)
    except UploadTooLarge:
        raise too_large(max_upload_bytes) from None
    except HTTPException as exc:  # malformed multipart, too many parts, an oversized text field
        raise bad_request(f"invalid multipart body: {exc.detail}") from None
    try:
        return await _validate(form.multi_items(), task=task, max_upload_bytes=max_upload_bytes)
    finally:
        await form.close()


async def _validate(items: list[tuple[str, Any]], *, task: str, max_upload_bytes: int) -> AudioRequest:
    allowed = FIELDS[task]
    unknown = sorted({name for name, _ in items if name not in allowed})
    if unknown:
        raise bad_request(f"unsupported field(s) {', '.join(map(repr, unknown))}; this endpoint accepts: "
                          f"{', '.join(allowed)}", param=unknown[0])
    fields: dict[str, Any] = {}
    granularities: list[str] = []
    for name, value in items:
        if name.startswith("timestamp_granularities"):
            granularities.append(_text(name, value))
            continue
        if name in fields:
            raise bad_request(f"field '{name}' was given more than once", param=name)
        fields[name] = value
    upload = fields.pop("file", None)
    if upload is None:
        raise bad_request("field 'file' is required: the audio file to transcribe", param="file")
    if not isinstance(upload, UploadFile):
        raise bad_request("field 'file' must be a file upload (a multipart part with a filename), got a text field",
                          param="file")
    audio = await upload.read()
    if len(audio) > max_upload_bytes:
        raise too_large(max_upload_bytes)
    if not audio:
        raise bad_request("field 'file' is empty (0 bytes)", param="file")
    text = {name: _text(name, value) for name, value in fields.items()}
    response_format = text.get("response_format", "json") or "json"
    if response_format not in FORMATS:
        raise bad_request(f"field 'response_format' must be one of {', '.join(FORMATS)}, got {response_format!r}",
                          param="response_format")
    for g in granularities:
        if g not in GRANULARITIES:
            raise bad_request(f"field 'timestamp_granularities[]' values must be segment or word, got {g!r}",
                              param="timestamp_granularities[]")
    if granularities and response_format != "verbose_json":
        raise bad_request("timestamp_granularities needs response_format=verbose_json",
                          param="timestamp_granularities[]")
    stream = _boolean("stream", text["stream"]) if "stream" in text else False
    if stream and response_format not in ("json", "text"):
        raise bad_request(f"stream=true sends transcript events; it needs response_format json or text, "
                          f"got {response_format!r}", param="stream")
    temperature = _number("temperature", text["temperature"], 0.0, 1.0) if "temperature" in text else None
    return AudioRequest(task=task, audio=audio, filename=upload.filename or "", model=text.get("model") or None,
                        language=text.get("language") or None, prompt=text.get("prompt") or None, response_format=response_format, temperature=temperature,
                        granularities=tuple(dict.fromkeys(granularities)), stream=stream,
                        vad_filter=_boolean("vad_filter", text["vad_filter"]) if "vad_filter" in text else False,
                        batched=_boolean("batched", text["batched"]) if "batched" in text else False)
