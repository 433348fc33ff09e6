"""Cooperative cancellation of long computations that are not module calls (feature extraction).

The engine runs a batch inside :func:`cancellable` with a check that raises once nobody waits for any
request of the batch; code with a natural chunk boundary (each tile of the spectral front-end) calls
:func:`check_cancelled` there.  Outside such a block the check does nothing.  The check is held in a
:class:`contextvars.ContextVar`, so it belongs to the thread (or task) that runs the batch.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator

_check: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar("oasr_cancel_check", default=None)


@contextlib.contextmanager
def cancellable(check: Callable[[], None]) -> Iterator[None]:
    """Run the block with ``check`` as the cancellation check (it raises to stop the work)."""
    token = _check.set(check)
    try:
        yield
    finally:
        _check.reset(token)


def check_cancelled() -> None:
    """Raise if the work this thread is doing was cancelled (no-op outside :func:`cancellable`)."""
    check = _check.get()
    if check is not None:
        check()
