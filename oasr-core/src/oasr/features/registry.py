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
from oasr.plugins import import_target

if TYPE_CHECKING:
    from oasr.features.config import FeatureConfig

RUNTIME_DISTRIBUTION = "<runtime>"


@attrs.frozen
class StreamingFraming:
    """How to reproduce a frontend's offline frame grid from a growing per-stream sample buffer.

    ``span``: samples one frame reads (``n_fft``, not the window length, for a centered STFT).
    ``hop``: frame advance.  ``history``: leading buffer samples that are context only (non-zero
    exactly when the per-sample transform reaches backwards, e.g. pre-emphasis).  ``prefill``: zeros
    the buffer starts with (what an offline pass implicitly starts with, history included).
    ``postfill``: zeros appended at the end of a stream so that its last frames are the offline ones.

    Frame ``j`` of a stream reads buffer samples ``[history + j * hop, history + j * hop + span)``.
    """

    span: int
    hop: int
    history: int = 0
    prefill: int = 0
    postfill: int = 0

    def __attrs_post_init__(self) -> None:
        if self.span < 1 or self.hop < 1 or min(self.history, self.prefill, self.postfill) < 0:
            raise ValueError(f"invalid StreamingFraming {self}: span and hop must be positive, the rest >= 0")

    def frames_in(self, num_samples: int) -> int:
        """Complete frames in a buffer of ``num_samples`` samples (history included)."""
        usable = num_samples - self.history - self.span
        return usable // self.hop + 1 if usable >= 0 else 0


@attrs.frozen
class ExtractorSpec:
    """What a frontend declares.

    ``fn``: the batch function (or a ``"module:function"`` string).  ``framing``: a
    :class:`StreamingFraming`, or a function of the config returning one (``None`` when that config
    cannot stream), or ``None``: not streamable.  ``streaming_fn``: the incremental variant of ``fn``
    for a grid that is not "restart at buffer position 0"; it takes the same arguments, treats
    ``lengths`` as the valid samples (later ones are zeros appended by a flush), frames the whole
    buffer with :class:`StreamingFraming` semantics and returns every frame that fits.
    ``window_seconds_attr``: the config field holding a fixed input window, if the recipe has one.
    ``feature_dim``: a function of the config giving the extractor's output dimension (default
    ``num_mel_bins``).  ``option_keys``: the ``FeatureConfig.options`` keys this frontend reads.
    ``validate``: a function of the config that raises :class:`~oasr.errors.ConfigError` for values
    this frontend cannot use; it runs when the config is built, so keep it free of heavy imports.
    """

    kind: str
    fn: Callable[..., Any] | str
    framing: StreamingFraming | Callable[..., StreamingFraming | None] | str | None = None
    streaming_fn: Callable[..., Any] | str | None = None
    window_seconds_attr: str | None = None
    feature_dim: Callable[..., int] | str | None = None
    option_keys: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    validate: Callable[..., None] | str | None = None
    description: str = ""

    @property
    def supports_streaming(self) -> bool:
        return self.framing is not None

    def framing_for(self, config: FeatureConfig) -> StreamingFraming | None:
        """The framing of this config, or None where the frontend (or this config of it) cannot stream."""
        framing = import_target(self.framing)
        if framing is None or isinstance(framing, StreamingFraming):
            return framing
        return framing(config)

    def dim_for(self, config: FeatureConfig) -> int:
        if self.feature_dim is None:
            return config.num_mel_bins
        return int(import_target(self.feature_dim)(config))


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
    """Resolve ``config.feature_type`` to its frontend, importing its functions now."""
    spec = get_extractor_spec(config.feature_type)
    streaming_fn = import_target(spec.streaming_fn) if spec.streaming_fn is not None else None
    return FeatureExtractor(spec, config, import_target(spec.fn), streaming_fn, spec.framing_for(config))
