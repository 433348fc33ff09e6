"""``oasr serve``: an OpenAI-compatible speech recognition server around one engine.

One process: FastAPI + uvicorn in front, one engine loop thread behind (:mod:`oasr.serve.runner`),
asyncio futures and queues per request in between.  ``create_app`` and ``ServerSettings`` are
imported lazily so that ``import oasr.serve`` (the CLI does) pulls in no web framework.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["ServerSettings", "create_app"]

_LAZY = {"create_app": "oasr.serve.app", "ServerSettings": "oasr.serve.settings"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'oasr.serve' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
