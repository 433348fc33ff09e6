"""Feature frontends as a registry axis: what a frontend declares, and how one is found and built.

A frontend is an :class:`ExtractorSpec` registered under its ``kind``; a :class:`FeatureConfig` selects
it by ``feature_type``.  Built-ins come from :func:`oasr.features.extractors.builtin_extractors` through
the ``oasr_register_extractors`` hook, exactly as a plugin's do; :func:`register_extractor` adds one at
runtime.  Registering a spec is the whole change a new frontend needs.

The extractor function contract::

    fn(padded (B, T) float32, lengths (B,) long, config) -> (features (B, T', F) float32, feat_lengths (B,) long)

Samples arrive already multiplied by ``config.audio_scale``; LFR stacking and normalization are applied
by the caller (:func:`oasr.features.extract_features_batch`), never by ``fn``.

This module imports no torch: listing frontends stays cheap, and callables given as ``"module:function"``
strings are imported the first time an extractor of that kind is built.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from oasr.errors import UnknownComponentError
from oasr.features.spec import ExtractorSpec, StreamingFraming
from oasr.imports import import_target

if TYPE_CHECKING:
    from oasr.features.config import FeatureConfig

RUNTIME_DISTRIBUTION = "<runtime>"


@attrs.define(eq=False)
class FeatureExtractor:
    """One frontend bound to one config: ``extractor(padded, lengths) -> (features, feat_lengths)``."""

    spec: ExtractorSpec
    config: FeatureConfig
    fn: Callable[..., Any]
    streaming_fn: Callable[..., Any] | None
    framing: StreamingFraming | None

    @property
    def kind(self) -> str:
        return self.spec.kind

    @property
    def supports_streaming(self) -> bool:
        return self.framing is not None

    @property
    def feature_dim(self) -> int:
        return self.spec.dim_for(self.config)

    def __call__(self, padded: Any, lengths: Any) -> tuple[Any, Any]:
        return self.fn(padded, lengths, self.config)


def _registry():
    from oasr import plugins

    return plugins.registry("extractors")


def register_extractor(spec: ExtractorSpec, *, override: bool = False,
                       distribution: str = RUNTIME_DISTRIBUTION) -> None:
    """Register a frontend at runtime (plugins use the ``oasr_register_extractors`` hook instead)."""
    if not isinstance(spec, ExtractorSpec):
        raise TypeError(f"register_extractor expects an ExtractorSpec, got {type(spec).__name__}")
    _registry().add(spec.kind, spec, distribution=distribution, override=override)


def unregister_extractor(kind: str) -> None:
    """Remove a frontend registered at runtime (tests)."""
    _registry().remove(kind)


def list_extractors() -> list[str]:
    """The registered frontend kinds, sorted."""
    return _registry().names()


def get_extractor_spec(kind: str) -> ExtractorSpec:
    """The :class:`ExtractorSpec` registered as ``kind``; unknown kinds name the registered ones."""
    spec = _registry().get(kind).load()
    if not isinstance(spec, ExtractorSpec):
        raise UnknownComponentError(f"extractor {kind!r} was registered with a {type(spec).__name__}, "
                                    f"not an ExtractorSpec", name=kind)
    return spec


def build_extractor(config: FeatureConfig) -> FeatureExtractor:
    """Resolve ``config.feature_type`` to its frontend, check the config against it and import its
    functions now."""
    spec = config.check_frontend()
    streaming_fn = import_target(spec.streaming_fn) if spec.streaming_fn is not None else None
    return FeatureExtractor(spec, config, import_target(spec.fn), streaming_fn, spec.framing_for(config))
