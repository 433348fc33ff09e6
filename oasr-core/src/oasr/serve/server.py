"""uvicorn around the app: a request-head deadline per connection, and a shutdown that drains first.

- :class:`HeadDeadlineProtocol` is uvicorn's h11 protocol with one addition: a connection must send a
  complete request head within ``ServerSettings.header_timeout`` seconds of connecting (or of its
  previous response), else it is closed.  A client trickling header bytes cannot hold a connection
  open forever.  (uvicorn's own keep-alive timeout stops at the first byte of the next request.)
- :class:`OasrServer` runs the app's drain (:meth:`oasr.serve.app.ServerState.drain`) *before* uvicorn
  closes connections: in-flight requests get ``shutdown_grace`` seconds, then each ends with its
  documented error (503 JSON, an SSE error event, a realtime ``failed`` event) while its connection is
  still open; uvicorn's own graceful wait then has nothing left to cancel.

:func:`uvicorn_config` builds the ``uvicorn.Config`` both ``oasr serve`` and the tests use.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

#: seconds uvicorn still waits after the app's drain, for responses being written
FLUSH_SECONDS = 2.0


class HeadDeadlineProtocol(H11Protocol):
    """h11 protocol that closes a connection whose request head is not complete in time."""

    head_timeout: float = 10.0

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        if self._head_timer is None and not self.transport.is_closing():
            self._head_timer = self.loop.call_later(self.head_timeout, self._head_expired)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_expired(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.logger.info("closing a connection that sent no complete request head in %g s", self.head_timeout)
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:
            self._arm()
        else:
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.conn.their_state is h11.IDLE:
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


def head_deadline_protocol(seconds: float) -> type[HeadDeadlineProtocol]:
    return type("HeadDeadlineProtocol", (HeadDeadlineProtocol,), {"head_timeout": float(seconds)})


class OasrServer(uvicorn.Server):
    """uvicorn.Server whose shutdown first drains the OASR app (see the module docstring)."""

    async def shutdown(self, sockets: Any = None) -> None:
        state = getattr(getattr(self.config.loaded_app, "state", None), "oasr", None)
        app = self.config.loaded_app
        while state is None and app is not None:  # uvicorn wraps the app in middleware proxies
            app = getattr(app, "app", None)
            state = getattr(getattr(app, "state", None), "oasr", None)
        for server in self.servers:  # stop accepting first, as uvicorn does
            server.close()
        if state is not None:
            await state.drain()
        await super().shutdown(sockets=sockets)


def uvicorn_config(app: Any, settings: Any, **kwargs: Any) -> uvicorn.Config:
    """The uvicorn.Config for ``app`` under ``settings`` (extra uvicorn options in ``kwargs``)."""
    kwargs.setdefault("timeout_graceful_shutdown", FLUSH_SECONDS)
    return uvicorn.Config(app, http=head_deadline_protocol(settings.header_timeout),
                          ws_max_size=settings.realtime_max_message_bytes, **kwargs)
