"""VAD options and the speech spans a VAD returns."""

from __future__ import annotations

import math

import attrs
from attrs import validators as v


def _probability(instance, attribute, value) -> None:
    if value is not None and not 0.0 <= value <= 1.0:
        raise ValueError(f"VadOptions.{attribute.name} must be a probability in [0, 1], got {value!r}")


@attrs.frozen(kw_only=True)
class VadOptions:
    """How speech probabilities become speech spans (faster-whisper's ``VadOptions``, same defaults).

    ``threshold``: a window whose speech probability reaches it starts (or continues) speech.
    ``neg_threshold``: below it a window is silence; between the two a window keeps the current state
    (None: ``max(threshold - 0.15, 0.01)``).  ``min_speech_duration_ms``: shorter spans are dropped.
    ``max_speech_duration_s``: a longer span is cut at its last silence of more than 98 ms, or hard
    at the limit when it has none.  ``min_silence_duration_ms``: a span ends only after this much
    silence.  ``speech_pad_ms``: each span is widened by this much on both sides (halving the gap
    instead when two spans are closer than twice the pad).
    """

    threshold: float = attrs.field(default=0.5, validator=_probability)
    neg_threshold: float | None = attrs.field(default=None, validator=_probability)
    min_speech_duration_ms: int = attrs.field(default=0, validator=v.ge(0))
    max_speech_duration_s: float = attrs.field(default=math.inf, validator=v.gt(0))
    min_silence_duration_ms: int = attrs.field(default=2000, validator=v.ge(0))
    speech_pad_ms: int = attrs.field(default=400, validator=v.ge(0))

    @property
    def silence_threshold(self) -> float:
        return self.neg_threshold if self.neg_threshold is not None else max(self.threshold - 0.15, 0.01)


@attrs.frozen
class SpeechSpan:
    """One span of speech, in samples: ``[start, end)``."""

    start: int
    end: int

    def seconds(self, sample_rate: int) -> tuple[float, float]:
        return self.start / sample_rate, self.end / sample_rate
