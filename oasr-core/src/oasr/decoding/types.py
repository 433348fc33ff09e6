"""Result types shared by every decode family."""

from __future__ import annotations

import attrs


@attrs.define
class WordTiming:
    """One word: a literal substring of the transcript, its time span in seconds and confidence."""

    word: str
    start: float
    end: float
    confidence: float | None = None


@attrs.define
class Segment:
    """A span of the transcript with its time range (long-form windows, subtitles)."""

    id: int
    start: float
    end: float
    text: str
    tokens: list[int] = attrs.field(factory=list)
    avg_logprob: float | None = None
    compression_ratio: float | None = None
    no_speech_prob: float | None = None
    temperature: float | None = None
    words: list[WordTiming] | None = None
    #: the start of the window it was decoded from, in feature frames (openai-whisper's ``seek``); None: 0
    seek: int | None = None


@attrs.define
class Hypothesis:
    """What a decode strategy returns for one request.

    ``tokens`` are model token ids (specials removed).  A strategy that builds its own text (for
    example from timestamped segments) sets ``text``; otherwise the engine detokenizes ``tokens``.
    ``token_frames`` are encoder frame indices of each token's emission; ``token_times`` start
    times in seconds; ``token_confidences`` posteriors in [0, 1].
    """

    tokens: list[int]
    score: float = 0.0
    text: str | None = None
    token_frames: list[int] | None = None
    token_times: list[float] | None = None
    token_end_times: list[float] | None = None
    token_confidences: list[float] | None = None
    words: list[WordTiming] | None = None
    segments: list[Segment] | None = None
    language: str | None = None
    confidence: float | None = None
    nbest: list[Hypothesis] | None = None
    #: labels of the whole utterance beside its language (see ``RequestOutput.tags``)
    tags: dict[str, str] | None = None
