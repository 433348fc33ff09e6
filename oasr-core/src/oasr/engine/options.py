"""Per-request decoding options and the per-request output."""

from __future__ import annotations

import attrs

from oasr.decoding.types import Segment, WordTiming

TASKS = ("transcribe", "translate")


def _tuple_of_str(value) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    return tuple(value)


def _temperatures(value) -> tuple[float, ...]:
    if isinstance(value, (int, float)):
        return (float(value),)
    return tuple(float(v) for v in value)


@attrs.frozen(kw_only=True)
class DecodingOptions:
    """What one request asks of decoding.  A field left at its default asks nothing.

    A decode family that cannot honour a non-default field refuses the request at admission (see
    ``DecodeStrategy.supported_options``); nothing is silently ignored.
    """

    language: str | None = None
    task: str = attrs.field(default="transcribe", validator=attrs.validators.in_(TASKS))
    word_timestamps: bool = False
    #: segment-level timestamps (for families that predict them, e.g. timestamp tokens)
    timestamps: bool = False
    beam_size: int | None = attrs.field(default=None, validator=attrs.validators.optional(attrs.validators.ge(1)))
    n_best: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    temperature: tuple[float, ...] = attrs.field(default=(0.0,), converter=_temperatures)
    prompt: str | None = None
    max_new_tokens: int | None = attrs.field(default=None, validator=attrs.validators.optional(attrs.validators.ge(1)))
    hotwords: tuple[str, ...] = attrs.field(default=(), converter=_tuple_of_str)

    def requested(self) -> set[str]:
        """Names of the fields set to something other than their default."""
        default = DecodingOptions()
        return {f.name for f in attrs.fields(DecodingOptions) if getattr(self, f.name) != getattr(default, f.name)}


@attrs.define
class RequestOutput:
    """The result (partial or final) of one request."""

    request_id: str
    text: str = ""
    tokens: list[int] = attrs.field(factory=list)
    words: list[WordTiming] | None = None
    segments: list[Segment] | None = None
    confidence: float | None = None
    language: str | None = None
    finished: bool = False
    #: "stop" (complete), "length" (hit a ceiling), "abort", "error"
    finish_reason: str | None = None
    error: str | None = None
    #: seconds of audio this request carried
    duration: float | None = None
    nbest: list[str] | None = None
