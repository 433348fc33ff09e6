"""Scale-out on Ray: batch transcription over a corpus with Ray Data, and ``oasr serve`` on Ray Serve.

Optional (``pip install "oasr-core[ray]"``): importing :mod:`oasr` or running the rest of the CLI never
imports Ray; this package imports it only when one of its functions runs, and a missing Ray is one
clear :class:`~oasr.errors.ConfigError` naming the extra.

- :func:`oasr.ray.transcribe_dataset` (``oasr transcribe --ray --workers N INPUT... -o DIR``): audio is
  decoded in Ray tasks, an actor pool of engines (one engine per worker, its batching intact) decodes
  it with ``map_batches``, each worker writes the same files as the in-process CLI, and a killed job
  resumes without redoing finished files (outputs are written atomically; a worker that dies is
  restarted and its batch retried by Ray Data).
- :mod:`oasr.ray.serve` (``oasr serve --ray --replicas N``): a Ray Serve deployment wrapping the
  FastAPI app of :mod:`oasr.serve.app` — one engine per replica, the same routes, SSE and realtime
  WebSocket through Ray Serve's ingress.
"""

from __future__ import annotations

from typing import Any

from oasr.ray.requirement import require_ray

__all__ = ["require_ray", "transcribe_dataset"]


def transcribe_dataset(*args: Any, **kwargs: Any):
    """See :func:`oasr.ray.data.transcribe_dataset`."""
    from oasr.ray.data import transcribe_dataset as run

    return run(*args, **kwargs)
