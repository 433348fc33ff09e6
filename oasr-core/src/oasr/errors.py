"""The exceptions OASR raises on purpose.

Every error a user can provoke (a bad checkpoint, an unknown model, undecodable audio, a request the
model cannot honour) is an :class:`OasrError`, so ``except oasr.OasrError`` catches all of them and
nothing else.  Each message names the thing, what was expected, what was found, and the fix.
"""

from __future__ import annotations

from typing import Any


class OasrError(Exception):
    """Base class of every error OASR raises deliberately."""


class UnknownModelError(OasrError, KeyError):
    """A model, architecture, alias or other registry name that nobody registered."""

    def __init__(self, message: str, *, name: str | None = None):
        super().__init__(message)
        self.name = name

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class UnknownComponentError(UnknownModelError):
    """A registry lookup (extractor, tokenizer, decoder, kernel) for a kind nobody registered."""


class CheckpointFormatError(OasrError, ValueError):
    """A checkpoint directory or file that cannot be loaded as asked."""

    def __init__(self, message: str, *, path: Any = None):
        super().__init__(message)
        self.path = path


class UnsupportedConfigError(CheckpointFormatError):
    """A checkpoint whose configuration names a feature this implementation does not build."""

    def __init__(self, message: str, *, path: Any = None, key: str | None = None):
        super().__init__(message, path=path)
        self.key = key


class AmbiguousCheckpointError(CheckpointFormatError):
    """Two converters claim a directory with the same specificity."""

    def __init__(self, message: str, *, path: Any = None, candidates: tuple[str, ...] = ()):
        super().__init__(message, path=path)
        self.candidates = candidates


class CapabilityError(OasrError, ValueError):
    """A model asked to do something (a decode family, an option) it cannot do."""

    def __init__(self, message: str, *, capability: str | None = None, missing: tuple[str, ...] = ()):
        super().__init__(message)
        self.capability = capability
        self.missing = missing


class AudioError(OasrError, ValueError):
    """Audio that cannot be decoded, is empty, non-finite or otherwise unusable."""

    def __init__(self, message: str, *, source: Any = None):
        super().__init__(message)
        self.source = source


class PluginLoadError(OasrError, ImportError):
    """A plugin distribution that failed to import or register (raised only in strict mode)."""

    def __init__(self, message: str, *, distribution: str | None = None):
        super().__init__(message)
        self.distribution = distribution


class ConfigError(OasrError, ValueError):
    """An invalid configuration value or an unknown configuration key."""

    def __init__(self, message: str, *, key: str | None = None):
        super().__init__(message)
        self.key = key


class RequestError(OasrError, ValueError):
    """A request refused at admission (bad options, audio too long, unknown id)."""

    def __init__(self, message: str, *, request_id: str | None = None, param: str | None = None):
        super().__init__(message)
        self.request_id = request_id
        self.param = param


class TranscriptionError(RequestError):
    """``Engine.transcribe`` inputs that failed; ``outputs`` holds every input's RequestOutput, in order."""

    def __init__(self, message: str, *, outputs: list | None = None):
        super().__init__(message)
        self.outputs: list = list(outputs or [])


class EngineFullError(OasrError, RuntimeError):
    """The engine cannot admit another request now (queue or stream pool full)."""
