"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}`` with an HTTP status.

The status table (what each refusal returns):

====== ======================= ===========================================================================
status type                    when
====== ======================= ===========================================================================
400    invalid_request_error   a missing, malformed or unsupported field; an empty file; an option the
                               model cannot honour (``param`` names the field)
401    invalid_request_error   missing or wrong API key (``code`` = ``invalid_api_key``)
404    invalid_request_error   a ``model`` that is not a served model name (``code`` = ``model_not_found``)
408    invalid_request_error   the request body did not arrive within ``--body-timeout`` (``code`` =
                               ``request_timeout``; the connection is closed)
413    invalid_request_error   the upload is larger than ``--max-upload-mb`` (``code`` = ``file_too_large``)
415    invalid_request_error   audio that cannot be decoded or is unusable: oasr.errors.AudioError
                               (``code`` = ``invalid_audio``)
429    rate_limit_error        ``--max-concurrency`` requests are already in flight, or
                               ``--max-pending-uploads`` bodies are being received
503    server_error            the server is starting, draining for shutdown, or the engine failed
500    server_error            a bug: anything not listed above
====== ======================= ===========================================================================
"""

from __future__ import annotations

import logging
from typing import Any

from oasr.errors import (
    AudioError,
    CapabilityError,
    ConfigError,
    EngineFullError,
    OasrError,
    RequestError,
    UnknownModelError,
)

logger = logging.getLogger("oasr.serve")


class ApiError(Exception):
    """A refusal the server returns to the client (never a crash)."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, *, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def overloaded(limit: int) -> ApiError:
    return ApiError(429, f"the server is at its concurrency limit ({limit} requests in flight); retry later",
                    type="rate_limit_error", code="rate_limit_exceeded", headers={"Retry-After": "1"})


def unavailable(message: str, *, code: str = "server_unavailable") -> ApiError:
    return ApiError(503, message, type="server_error", code=code, headers={"Retry-After": "1"})


def internal(message: str) -> ApiError:
    return ApiError(500, message, type="server_error", code="internal_error")


def from_oasr_error(exc: OasrError) -> ApiError:
    """The API error for an OasrError raised while admitting or running a request."""
    if isinstance(exc, AudioError):
        return ApiError(415, f"the audio could not be used: {exc}", param="file", code="invalid_audio")
    if isinstance(exc, EngineFullError):
        return ApiError(429, str(exc), type="rate_limit_error", code="rate_limit_exceeded",
                        headers={"Retry-After": "1"})
    if isinstance(exc, UnknownModelError):
        return ApiError(404, str(exc), param="model", code="model_not_found")
    if isinstance(exc, RequestError):
        return bad_request(str(exc), param=exc.param)
    if isinstance(exc, CapabilityError):
        return bad_request(str(exc), param=exc.capability)
    if isinstance(exc, ConfigError):
        return bad_request(str(exc), param=exc.key)
    return bad_request(str(exc))


#: the prefix the engine puts on a decode failure that was not an OasrError (a bug)
INTERNAL_PREFIX = "internal error"


def from_failed_output(message: str | None) -> ApiError:
    """The API error for a request the engine finished with ``finish_reason="error"``."""
    message = message or "the request failed without a message"
    if message.startswith(INTERNAL_PREFIX):
        return internal(message)
    return bad_request(message, code="transcription_failed")
