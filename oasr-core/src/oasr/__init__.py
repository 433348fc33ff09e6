"""OASR: speech recognition inference and serving.

The public face is the names in ``__all__``; they are imported lazily, so ``import oasr`` is cheap
and imports no model family.
"""

from __future__ import annotations

import importlib
from typing import Any

from oasr.errors import (
    AudioError,
    CapabilityError,
    CheckpointFormatError,
    ConfigError,
    OasrError,
    PluginLoadError,
    RequestError,
    TranscriptionError,
    UnknownModelError,
)
from oasr.hookspecs import hookimpl

__version__ = "0.1.0"

_LAZY = {
    "from_pretrained": "oasr.checkpoints.loading",
    "load_pretrained": "oasr.checkpoints.loading",
    "list_models": "oasr.models.registry",
    "register_model": "oasr.models.registry",
    "Engine": "oasr.engine",
    "ASREngine": "oasr.engine",
    "EngineConfig": "oasr.engine",
    "DecodingOptions": "oasr.engine",
    "RequestOutput": "oasr.engine",
    "Segment": "oasr.engine",
    "WordTiming": "oasr.decoding.words",
    "load_audio": "oasr.audio",
}

__all__ = [
    "ASREngine", "AudioError", "CapabilityError", "CheckpointFormatError", "ConfigError", "DecodingOptions",
    "Engine", "EngineConfig", "OasrError", "PluginLoadError", "RequestError", "RequestOutput", "Segment",
    "TranscriptionError", "UnknownModelError", "WordTiming", "__version__", "from_pretrained", "hookimpl",
    "list_models", "load_audio", "load_pretrained", "register_model",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'oasr' has no attribute {name!r}")
    attr = "load" if name == "load_audio" else name
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
