"""ServerSettings: what the HTTP/WebSocket front enforces (the engine's own knobs are EngineConfig)."""

from __future__ import annotations

import attrs
from attrs import validators as v

#: slack over ``max_upload_bytes`` for the multipart framing and the small form fields
MULTIPART_OVERHEAD = 64 * 1024


@attrs.define(kw_only=True)
class ServerSettings:
    """Limits and identity of one server.

    ``served_model_names`` are the names clients put in ``model`` (the first is the one /v1/models
    lists first); empty means "the engine's model id as given".  A request naming any other model is
    refused with 404: one server serves one model, and a silent substitution would hide a client's
    misconfiguration.
    """

    served_model_names: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    #: when set, /v1/* requires ``Authorization: Bearer <api_key>`` (/health, /ready, /metrics stay open)
    api_key: str | None = None
    #: the largest audio upload accepted; enforced while reading the body
    max_upload_bytes: int = attrs.field(default=25 * 1024 * 1024, validator=v.gt(0))
    #: requests admitted at once (HTTP requests and realtime items); the next one gets 429.  A slot is
    #: taken once the body has arrived, so slow uploads never hold one
    max_concurrency: int = attrs.field(default=64, validator=v.ge(1))
    #: request bodies being received at once; the next upload gets 429 (bounds the upload buffers)
    max_pending_uploads: int = attrs.field(default=128, validator=v.ge(1))
    #: a request body must arrive completely within this many seconds of the handler starting (408)
    body_timeout: float = attrs.field(default=120.0, validator=v.gt(0))
    #: a connection must send a complete request head within this many seconds (else it is closed)
    header_timeout: float = attrs.field(default=10.0, validator=v.gt(0))
    #: a request still unfinished after this many seconds is aborted (503)
    request_timeout: float = attrs.field(default=600.0, validator=v.gt(0))
    #: on shutdown, in-flight requests get this long to finish before they are aborted
    shutdown_grace: float = attrs.field(default=30.0, validator=v.ge(0))
    #: the most audio one realtime buffer may hold before it is committed
    realtime_max_buffer_seconds: float = attrs.field(default=600.0, validator=v.gt(0))
    #: uncommitted realtime audio held over all sessions at once (offline engines buffer until commit)
    realtime_max_total_buffer_seconds: float = attrs.field(default=3600.0, validator=v.gt(0))
    #: offline engines, sessions opened with ``?partials=true``: the buffer so far is transcribed again after
    #: this many seconds of new audio and sent as a partial transcript (0: never)
    realtime_partial_seconds: float = attrs.field(default=1.0, validator=v.ge(0))
    #: realtime sessions open at once; the next handshake gets 429
    realtime_max_sessions: int = attrs.field(default=64, validator=v.ge(1))
    #: the largest WebSocket message accepted (OpenAI's limit for one append is 15 MiB of base64)
    realtime_max_message_bytes: int = attrs.field(default=16 * 1024 * 1024, validator=v.gt(0))

    @property
    def max_body_bytes(self) -> int:
        return self.max_upload_bytes + MULTIPART_OVERHEAD
