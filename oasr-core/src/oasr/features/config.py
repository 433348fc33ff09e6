"""FeatureConfig: everything a frontend needs to turn [-1, 1] samples into model input features.

The engine materializes it from the checkpoint's :class:`oasr.models.FeatureSpec`
(:meth:`FeatureConfig.from_spec`) unless the caller gives one.  A FeatureConfig is a plain value:
constructing one checks its own fields (positive sizes, a known ``normalize`` mode) and consults
no registry.  What depends on the frontend — a registered ``feature_type``, the ``options`` keys it
reads, its own value checks — is checked by :meth:`FeatureConfig.check_frontend`, which runs where
an extractor is built (:func:`oasr.features.build_extractor`) and when the engine is constructed.

Field meanings (Kaldi's names and defaults where Kaldi has the option):

- ``feature_type``: a registered extractor kind (``kaldi_fbank``, ``kaldi_mfcc``, ``whisper_logmel``,
  ``nemotron_logmel`` are built in).
- ``sample_rate``, ``num_mel_bins``, ``frame_length_ms`` / ``frame_shift_ms`` (window and hop; the sample
  counts truncate as Kaldi does), ``n_fft`` (None: the kind's default — Kaldi rounds the window up to a
  power of two, Whisper uses 400, NeMo 512).
- Kaldi: ``dither``, ``window_type`` (povey, hanning, hamming, blackman, rectangular), ``snip_edges``,
  ``low_freq`` / ``high_freq`` (a high_freq <= 0 is an offset from Nyquist), ``use_energy``,
  ``energy_floor``, ``num_ceps`` and ``cepstral_lifter`` (MFCC).
- ``preemphasis``: None means the kind's default (0.97 for Kaldi and NeMo); 0.0 disables it.
- ``lfr_m`` / ``lfr_n``: low-frame-rate stacking of ``lfr_m`` frames every ``lfr_n`` (FunASR), offline only.
- ``window_seconds``: a fixed input window (Whisper's 30 s pad/trim); None: features of the audio as is.
- ``normalize``: None, ``"per_feature"`` (per utterance and mel bin, over valid frames: mean and unbiased
  std + 1e-5, as NeMo/HF Parakeet) or ``"cmvn"`` (``(x - options["cmvn_mean"]) * options["cmvn_istd"]``,
  vectors of the output dimension, after LFR).
- ``audio_scale``: multiplies [-1, 1] samples first: 32768 for WeNet and FunASR, 1.0 for icefall,
  Whisper and NeMo.  A wrong value silently changes every feature.
- ``options``: kind-specific keys the extractor declares (``ExtractorSpec.option_keys``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import attrs

from oasr.errors import ConfigError

if TYPE_CHECKING:
    from oasr.features.spec import ExtractorSpec
    from oasr.models.specs import FeatureSpec

NORMALIZE_MODES = (None, "per_feature", "cmvn")
NORMALIZE_OPTION_KEYS = {"cmvn": ("cmvn_mean", "cmvn_istd")}


def _options(value: Any) -> dict[str, Any]:
    return dict(value or {})


@attrs.frozen(kw_only=True, hash=False)
class FeatureConfig:
    """The frontend, its frame grid and its post-processing (see the module docstring)."""

    feature_type: str = "kaldi_fbank"
    sample_rate: int = 16000
    num_mel_bins: int = 80
    frame_length_ms: float = 25.0
    frame_shift_ms: float = 10.0
    n_fft: int | None = None
    dither: float = 0.0
    window_type: str = "povey"
    snip_edges: bool = True
    low_freq: float = 20.0
    high_freq: float = 0.0
    use_energy: bool = False
    energy_floor: float = 0.0
    num_ceps: int = 13
    cepstral_lifter: float = 22.0
    preemphasis: float | None = None
    lfr_m: int = 1
    lfr_n: int = 1
    window_seconds: float | None = None
    normalize: str | None = None
    audio_scale: float = 1.0
    options: dict[str, Any] = attrs.field(factory=dict, converter=_options)

    def __attrs_post_init__(self) -> None:
        positive = {"sample_rate": self.sample_rate, "num_mel_bins": self.num_mel_bins,
                    "frame_length_ms": self.frame_length_ms, "frame_shift_ms": self.frame_shift_ms,
                    "audio_scale": self.audio_scale, "lfr_m": self.lfr_m, "lfr_n": self.lfr_n}
        for key, value in positive.items():
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ConfigError(f"FeatureConfig.{key} must be a positive number, got {value!r}", key=key)
        for key in ("lfr_m", "lfr_n", "num_mel_bins", "sample_rate"):
            if int(getattr(self, key)) != getattr(self, key):
                raise ConfigError(f"FeatureConfig.{key} must be an integer, got {getattr(self, key)!r}", key=key)
        if self.frame_length < 2 or self.frame_shift < 1:
            raise ConfigError(f"frame_length_ms={self.frame_length_ms} / frame_shift_ms={self.frame_shift_ms} give "
                              f"{self.frame_length} / {self.frame_shift} samples at {self.sample_rate} Hz; need a "
                              f"window of at least 2 samples and a hop of at least 1", key="frame_length_ms")
        if self.dither < 0:
            raise ConfigError(f"FeatureConfig.dither must be >= 0, got {self.dither}", key="dither")
        if self.preemphasis is not None and not 0.0 <= self.preemphasis <= 1.0:
            raise ConfigError(f"FeatureConfig.preemphasis must be in [0, 1] or None, got {self.preemphasis}",
                              key="preemphasis")
        if self.window_seconds is not None and not self.window_seconds > 0:
            raise ConfigError(f"FeatureConfig.window_seconds must be positive or None, got {self.window_seconds}",
                              key="window_seconds")
        if self.n_fft is not None and (self.n_fft < 2 or self.n_fft % 2):
            raise ConfigError(f"FeatureConfig.n_fft must be an even number >= 2 or None, got {self.n_fft}",
                              key="n_fft")
        if self.normalize not in NORMALIZE_MODES:
            raise ConfigError(f"FeatureConfig.normalize {self.normalize!r} is not one of "
                              f"{', '.join(repr(m) for m in NORMALIZE_MODES)}", key="normalize")
        for key in NORMALIZE_OPTION_KEYS.get(self.normalize, ()):
            if key not in self.options:
                raise ConfigError(f"normalize={self.normalize!r} needs options[{key!r}]", key="options")

    def check_frontend(self) -> ExtractorSpec:
        """The registered frontend of ``feature_type``, once this config is checked against it: the
        ``options`` it reads and its own value checks (``ExtractorSpec.validate``)."""
        spec = self.extractor_spec()  # fails for an unregistered feature_type
        allowed = set(spec.option_keys) | set(NORMALIZE_OPTION_KEYS.get(self.normalize, ()))
        unknown = sorted(set(self.options) - allowed)
        if unknown:
            raise ConfigError(f"FeatureConfig.options {unknown} are not read by feature_type {self.feature_type!r}"
                              f"{' with normalize=' + repr(self.normalize) if self.normalize else ''}; accepted: "
                              f"{', '.join(sorted(allowed)) or '(none)'}", key="options")
        if spec.validate is not None:
            from oasr.imports import import_target

            import_target(spec.validate)(self)
        return spec

    @classmethod
    def from_spec(cls, spec: FeatureSpec, **overrides: Any) -> FeatureConfig:
        """The config a checkpoint's :class:`~oasr.models.FeatureSpec` describes.

        Spec fields map by name (``kind`` → ``feature_type``); ``spec.options`` keys that name a
        config field (``n_fft``, ``energy_floor``, ``cepstral_lifter``) set it, the rest stay options.
        """
        fields = {f.name for f in attrs.fields(cls)}
        data: dict[str, Any] = {"feature_type": spec.kind}
        for field in attrs.fields(type(spec)):
            if field.name in ("kind", "options"):
                continue
            if field.name not in fields:
                raise ConfigError(f"FeatureSpec field {field.name!r} has no FeatureConfig counterpart",
                                  key=field.name)
            data[field.name] = getattr(spec, field.name)
        options = dict(spec.options)
        for key in [k for k in options if k in fields and k != "options"]:
            data[key] = options.pop(key)
        data["options"] = options
        data.update(overrides)
        return cls(**data)

    def extractor_spec(self) -> ExtractorSpec:
        from oasr.errors import UnknownComponentError
        from oasr.features.registry import get_extractor_spec, list_extractors

        try:
            return get_extractor_spec(self.feature_type)
        except UnknownComponentError:
            raise ConfigError(f"FeatureConfig.feature_type {self.feature_type!r} is not a registered extractor; "
                              f"registered: {', '.join(list_extractors()) or '(none)'}",
                              key="feature_type") from None

    # --- the grid ------------------------------------------------------------------------------
    @property
    def frame_length(self) -> int:
        """Window length in samples (Kaldi truncates)."""
        return int(self.sample_rate * self.frame_length_ms * 0.001)

    @property
    def frame_shift(self) -> int:
        """Hop in samples (Kaldi truncates)."""
        return int(self.sample_rate * self.frame_shift_ms * 0.001)

    @property
    def effective_preemphasis(self) -> float:
        return 0.97 if self.preemphasis is None else float(self.preemphasis)

    @property
    def feature_dim(self) -> int:
        """Dimension of the extractor's output, before LFR."""
        return self.extractor_spec().dim_for(self)

    @property
    def output_dim(self) -> int:
        """Dimension of the features the model sees (LFR stacking folded in)."""
        return self.feature_dim * self.lfr_m

    @property
    def output_frame_shift(self) -> int:
        """Samples per output frame (LFR folded in)."""
        return self.frame_shift * self.lfr_n

    @property
    def fixed_window_seconds(self) -> float | None:
        """The fixed input window this frontend pads/trims every row to, or None."""
        attr = self.extractor_spec().window_seconds_attr
        return None if attr is None else getattr(self, attr)

    @property
    def fixed_window_frames(self) -> int | None:
        seconds = self.fixed_window_seconds
        if seconds is None:
            return None
        return round(seconds * self.sample_rate) // self.frame_shift

    def __hash__(self) -> int:
        return hash(self.cache_key())

    def cache_key(self) -> tuple:
        """A hashable identity of this config (options included)."""
        items = []
        for field in attrs.fields(type(self)):
            value = getattr(self, field.name)
            if field.name == "options":
                value = tuple(sorted((k, repr(v)) for k, v in value.items()))
            items.append(value)
        return tuple(items)
