"""What a feature frontend declares (:class:`ExtractorSpec`) and its streaming frame grid.

Pure declarations: nothing here consults the plugin registry, so the built-in frontends can be
declared while the registry is being filled (:mod:`oasr.features.registry` looks them up).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from oasr.imports import import_target

if TYPE_CHECKING:
    from oasr.features.config import FeatureConfig


@attrs.frozen
class StreamingFraming:
    """How to reproduce a frontend's offline frame grid from a growing per-stream sample buffer.

    ``span``: samples one frame reads (``n_fft``, not the window length, for a centered STFT).
    ``hop``: frame advance.  ``history``: leading buffer samples that are context only (non-zero
    exactly when the per-sample transform reaches backwards, e.g. pre-emphasis).  ``prefill``: zeros
    the buffer starts with (what an offline pass implicitly starts with, history included).
    ``postfill``: zeros appended at the end of a stream so that its last frames are the offline ones.
    ``mirror``: Kaldi's ``snip_edges=False`` grid, whose frame ``j`` starts ``mirror`` samples before
    ``j * hop`` and reads the signal mirrored at both ends (``x[-1 - k] = x[k]``): the buffer starts
    with the stream's first ``mirror`` samples reversed once they have arrived (no frame is ready
    before), a flush mirrors the stream's end, and a stream has ``(N + hop // 2) // hop`` frames in
    all.  ``mirror`` excludes ``history``, ``prefill`` and ``postfill``.

    Frame ``j`` of a stream reads buffer samples ``[history + j * hop, history + j * hop + span)``.
    """

    span: int
    hop: int
    history: int = 0
    prefill: int = 0
    postfill: int = 0
    mirror: int = 0

    def __attrs_post_init__(self) -> None:
        if self.span < 1 or self.hop < 1 or min(self.history, self.prefill, self.postfill, self.mirror) < 0:
            raise ValueError(f"invalid StreamingFraming {self}: span and hop must be positive, the rest >= 0")
        if self.mirror and (self.history or self.prefill or self.postfill):
            raise ValueError(f"invalid StreamingFraming {self}: mirror excludes history, prefill and postfill")

    def total_frames(self, num_samples: int) -> int:
        """Frames of a whole ``mirror`` stream of ``num_samples`` samples (Kaldi's snip_edges=False count)."""
        return (num_samples + self.hop // 2) // self.hop

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
