"""Per-request decoding options and the per-request output."""

from __future__ import annotations

import attrs

from oasr.decoding.types import Segment, WordTiming
from oasr.vad.options import VadOptions

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


def _numbers(kind):
    """A converter to a tuple of ``kind`` from a number, a sequence or a comma-separated string
    (openai-whisper's command-line form: ``"-1"``, ``"0,12.5,30"``)."""

    def convert(value) -> tuple:
        if value is None:
            return ()
        if isinstance(value, str):
            return tuple(kind(v) for v in value.split(",") if v.strip())
        if isinstance(value, (int, float)):
            return (kind(value),)
        return tuple(kind(v) for v in value)

    return convert


#: openai-whisper ``transcribe``'s temperature fallback schedule
FALLBACK_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


@attrs.frozen(kw_only=True)
class DecodingOptions:
    """What one request asks of decoding.  A field left at its default asks nothing.

    A decode family that cannot honour a non-default field refuses the request at admission (see
    ``DecodeStrategy.supported_options``); nothing is silently ignored.

    The defaults are openai-whisper ``transcribe()``'s (for families that decode autoregressively
    with timestamp tokens): timestamp tokens on, the fallback schedule ``FALLBACK_TEMPERATURES`` with
    its compression-ratio / log-probability / no-speech thresholds, and conditioning on the previous
    window's text.  ``timestamps`` only chooses whether the output carries the timed segments.
    """

    language: str | None = None
    task: str = attrs.field(default="transcribe", validator=attrs.validators.in_(TASKS))
    word_timestamps: bool = False
    #: the output carries the model's timed segments (families that predict them); False leaves them
    #: out (one segment spans the audio).  Decoding is the same either way (see ``without_timestamps``)
    timestamps: bool = True
    #: decode without timestamp tokens (openai-whisper's ``without_timestamps``); audio longer than
    #: one window is still cut at timestamps.  None: False, except with ``batched``, where it is True
    #: (faster-whisper's batched pipeline default)
    without_timestamps: bool | None = None
    beam_size: int | None = attrs.field(default=None, validator=attrs.validators.optional(attrs.validators.ge(1)))
    n_best: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    #: a tuple is a fallback schedule: a window that fails the thresholds below is decoded again at the next
    temperature: tuple[float, ...] = attrs.field(default=FALLBACK_TEMPERATURES, converter=_temperatures)
    #: fall back when the gzip compression ratio of a window's text is above this (None: never)
    compression_ratio_threshold: float | None = 2.4
    #: fall back when a window's average log-probability is below this (None: never)
    logprob_threshold: float | None = -1.0
    #: a window whose no-speech probability is above this and whose log-probability is below
    #: ``logprob_threshold`` is silence (None: never)
    no_speech_threshold: float | None = 0.6
    #: the previous window's text prompts the next (dropped after a temperature above 0.5)
    condition_on_previous_text: bool = True
    #: text that prompts the first window (openai-whisper's ``initial_prompt``)
    initial_prompt: str | None = None
    #: the same as ``initial_prompt`` (the name the OpenAI transcription API uses)
    prompt: str | None = None
    #: token ids never emitted; -1 stands for the checkpoint's own non-speech set
    suppress_tokens: tuple[int, ...] = attrs.field(default=(-1,), converter=_numbers(int))
    #: seconds: start,end pairs of the audio to decode (an odd last start runs to the end)
    clip_timestamps: tuple[float, ...] = attrs.field(default=(0.0,), converter=_numbers(float))
    #: with word timestamps, skip silent stretches longer than this many seconds around a
    #: likely hallucination (None: off)
    hallucination_silence_threshold: float | None = None
    #: candidates sampled per window at a temperature above zero (None: one)
    best_of: int | None = attrs.field(default=None, validator=attrs.validators.optional(attrs.validators.ge(1)))
    #: beam search: finished candidates collected = beam_size x patience (None: 1.0)
    patience: float | None = None
    #: beam ranking: None divides the log-probability by the length; a value uses the Google NMT penalty
    length_penalty: float | None = None
    max_new_tokens: int | None = attrs.field(default=None, validator=attrs.validators.optional(attrs.validators.ge(1)))
    hotwords: tuple[str, ...] = attrs.field(default=(), converter=_tuple_of_str)
    #: decode only the speech a voice activity detector finds (faster-whisper's ``vad_filter``);
    #: the silence it skips is reported in ``RequestOutput.silences``
    vad_filter: bool = False
    #: VAD rules for ``vad_filter`` and for cutting long audio at silences (None: the defaults)
    vad_options: VadOptions | None = None
    #: batched long-form (faster-whisper's ``BatchedInferencePipeline``), for families that long-form
    #: themselves: the VAD's speech spans (``vad_options``, at most one window each; None: faster-whisper's
    #: batched defaults) are merged into chunks of up to one window, and every chunk is decoded on its own
    #: (no previous text, the first temperature only, no fallback or no-speech skipping), the chunks
    #: batched like any requests; times are in the original audio, silences in ``RequestOutput.silences``
    batched: bool = False

    def requested(self) -> set[str]:
        """Names of the fields set to something other than their default (those the engine itself
        honours for every family, ``ENGINE_OPTIONS``, left out)."""
        default = DecodingOptions()
        names = {f.name for f in attrs.fields(DecodingOptions)
                 if f.name not in ENGINE_OPTIONS and getattr(self, f.name) != getattr(default, f.name)}
        if self.temperature == (0.0,):
            names.discard("temperature")  # plain greedy decoding: what every family does
        return names


#: DecodingOptions fields the engine honours for every family (long-form cutting, VAD)
ENGINE_OPTIONS = frozenset({"vad_filter", "vad_options"})


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
    #: labels a model predicts for the whole utterance beside its language, by kind (SenseVoice:
    #: ``{"emotion": "NEUTRAL", "event": "Speech", "text_norm": "woitn"}``); None when it predicts none
    tags: dict[str, str] | None = None
    #: (start, end) seconds that ``vad_filter`` judged silent and did not decode
    silences: list[tuple[float, float]] | None = None
