"""Long-form audio for every offline family: cut at VAD silences, decode the pieces as a batch, stitch.

A request becomes a *plan* at admission when it asks for ``vad_filter`` or its audio is longer than
the segment limit (``EngineConfig.long_form_seconds``, else the model's ``max_segment_seconds``,
else the fixed window of a model that cannot long-form itself).  The pieces of a plan are queued as
requests of their own, so the scheduler batches them with each other and with other requests, and
no forward ever sees more than one limit's worth of audio.

- Audio longer than the limit is cut at the longest silence (VAD probability below the silence
  threshold for at least ``MIN_CUT_SILENCE_S``) in the second half of each limit-long stretch.
  Where there is none (continuous speech) the stretch is decoded as overlapping pieces
  (``OVERLAP_SECONDS``) and each token is kept from the piece where it sits away from the edge:
  the pieces meet at the middle of the overlap, a token timed before it comes from the earlier piece,
  one at or after it from the later.  Every sample is decoded.
- With ``vad_filter`` only the speech spans are decoded (each a piece, cut as above when longer than
  the limit) and the rest is reported in ``RequestOutput.silences``.  A family that long-forms
  itself (its strategy ``supports_long_form``, e.g. windowed autoregressive decoding) gets the
  speech spans joined into one request, as faster-whisper's ``vad_filter`` does, and its timestamps
  are mapped back to the original audio.
- With ``batched`` (faster-whisper's ``BatchedInferencePipeline``, for a family that long-forms
  itself) the speech spans (at most one window each) are merged, in order, into chunks of up to one
  window (``collect_chunks``); each chunk's joined speech is a piece of its own, so the chunks are
  decoded independently and batched; their times are shifted by the chunk's place in the joined
  speech and mapped back to the original audio as ``vad_filter``'s are.
- Cut points fall on multiples of the encoder's frame stride, so a piece's frames are the same
  frames the whole audio would have.
"""

from __future__ import annotations

import bisect
import math
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np
import torch

from oasr.decoding.types import Hypothesis, Segment, WordTiming
from oasr.engine.options import DecodingOptions, RequestOutput
from oasr.errors import OasrError
from oasr.vad.options import SpeechSpan, VadOptions

if TYPE_CHECKING:
    from oasr.engine.engine import Engine, Request

#: seconds two pieces of continuous speech share
OVERLAP_SECONDS = 1.0
#: a silence at least this long is a place to cut
MIN_CUT_SILENCE_S = 0.1


@attrs.frozen
class Piece:
    """Samples ``[start, end)`` of the request's audio; tokens timed outside ``[keep_from, keep_until)``
    (absolute seconds) belong to an overlapping neighbour."""

    start: int
    end: int
    keep_from: float = -math.inf
    keep_until: float = math.inf
    #: batched long-form: the speech spans (of the request's audio) whose joined samples are this piece;
    #: ``start``/``end`` are then the piece's place in the joined speech
    spans: tuple[SpeechSpan, ...] | None = None

    @property
    def trimmed(self) -> bool:
        return self.keep_from != -math.inf or self.keep_until != math.inf


@attrs.define(eq=False)
class Plan:
    """How one request is decoded in pieces, and what its pieces returned so far."""

    pieces: list[Piece]
    #: seconds judged silent by ``vad_filter`` (None: every sample is decoded)
    silences: list[tuple[float, float]] | None
    #: the speech spans whose audio, joined, is the single piece (families that long-form themselves)
    joined: list[SpeechSpan] | None = None
    #: batched long-form: each piece is a chunk of ``joined`` decoded on its own
    batched: bool = False
    results: list[Any] = attrs.field(factory=list)
    remaining: int = 0

    def __attrs_post_init__(self) -> None:
        self.results = [None] * len(self.pieces)
        self.remaining = len(self.pieces)


def silences_of(spans: list[SpeechSpan], num_samples: int, rate: int) -> list[tuple[float, float]]:
    edges = [0] + [x for s in spans for x in (s.start, s.end)] + [num_samples]
    return [(round(a / rate, 3), round(b / rate, 3)) for a, b in zip(edges[::2], edges[1::2], strict=True) if b > a]


def batched_vad_options(given: VadOptions | None, window_seconds: float) -> VadOptions:
    """The VAD rules of batched long-form: faster-whisper's batched defaults (spans of at most one
    window, 160 ms minimum silence), or the given rules with spans capped at one window."""
    if given is None:
        return VadOptions(max_speech_duration_s=window_seconds, min_silence_duration_ms=160)
    return attrs.evolve(given, max_speech_duration_s=min(given.max_speech_duration_s, window_seconds))


def merge_spans(spans: list[SpeechSpan], max_samples: int) -> list[list[SpeechSpan]]:
    """Consecutive spans joined into chunks of at most ``max_samples`` speech samples, a span that
    would overflow the current chunk starting the next (faster-whisper's ``collect_chunks``)."""
    chunks: list[list[SpeechSpan]] = []
    current: list[SpeechSpan] = []
    length = 0
    for span in spans:
        size = span.end - span.start
        if current and length + size > max_samples:
            chunks.append(current)
            current, length = [], 0
        current.append(span)
        length += size
    if current:
        chunks.append(current)
    return chunks


def cut_region(start: int, end: int, silent: np.ndarray, *, limit: int, overlap: int, align: int,
               window: int, min_run: int, rate: int) -> list[Piece]:
    """Pieces of at most ``limit`` samples covering ``[start, end)``: cut at the longest silence in the
    second half of each stretch, or split with ``overlap`` where there is none.  ``silent[i]`` says
    whether VAD window ``i`` (``window`` samples) is silence."""
    pieces: list[Piece] = []
    keep_from = -math.inf
    pos = start
    while end - pos > limit:
        lo, hi = pos + limit // 2, pos + limit
        cut = _longest_silence(silent, lo, hi, window=window, min_run=min_run, align=align)
        if cut is not None:
            pieces.append(Piece(pos, cut, keep_from))
            pos, keep_from = cut, -math.inf
            continue
        stop = hi // align * align
        nxt = max(pos + align, (stop - overlap) // align * align)
        meet = ((nxt + stop) // 2) // align * align
        pieces.append(Piece(pos, stop, keep_from, meet / rate))
        pos, keep_from = nxt, meet / rate
    pieces.append(Piece(pos, end, keep_from))
    return pieces


def _longest_silence(silent: np.ndarray, lo: int, hi: int, *, window: int, min_run: int, align: int) -> int | None:
    """The aligned middle of the longest run of silent windows inside ``[lo, hi]`` (None: no run of
    ``min_run`` windows); ties go to the later run."""
    first, last = -(-lo // window), min(hi // window, len(silent))  # windows wholly inside
    if last - first < min_run:
        return None
    flags = np.concatenate([[False], silent[first:last], [False]])
    edges = np.flatnonzero(np.diff(flags.astype(np.int8)))
    starts, stops = edges[::2], edges[1::2]
    if not len(starts):
        return None
    lengths = stops - starts
    best = len(lengths) - 1 - int(np.argmax(lengths[::-1]))
    if lengths[best] < min_run:
        return None
    middle = (first + (starts[best] + stops[best]) / 2) * window
    cut = int(middle // align * align)
    return cut if lo <= cut <= hi else None


class LongForm:
    """The engine's long-form planner and stitcher (one per engine)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.rate = engine.sample_rate
        config, model, strategy = engine.config, engine.model, engine.strategy
        limit = config.long_form_seconds or model.max_segment_seconds
        if limit is None and engine.window_seconds is not None and not strategy.supports_long_form:
            limit = engine.window_seconds
        self.limit_seconds: float | None = limit
        self.joins = strategy.supports_long_form
        #: batched long-form: the most speech in one chunk (the model's window, else the segment limit)
        self.chunk_seconds: float | None = engine.window_seconds or limit
        stride = engine._hop * max(1, int(engine.feature_config.lfr_n)) * max(1, model.encoder.subsampling_rate)
        self.align = stride
        self._vad = None

    @property
    def vad(self):
        """The VAD that scores the audio (default: the shared Silero VAD); anything with
        ``probabilities(audio) -> one float per 512-sample window`` may be set here."""
        if self._vad is None:
            from oasr.vad import default_vad

            self._vad = default_vad()
        return self._vad

    @vad.setter
    def vad(self, value) -> None:
        self._vad = value

    # -- planning --------------------------------------------------------------------------------------
    def plan(self, samples: torch.Tensor, options: DecodingOptions, request_id: str) -> Plan | None:
        """None when the request is decoded whole; otherwise its pieces."""
        n = samples.numel()
        limit = None if self.limit_seconds is None else int(self.limit_seconds * self.rate)
        if not options.vad_filter and not options.batched and (limit is None or n <= limit):
            return None
        from oasr.vad.silero import check_rate
        from oasr.vad.spans import WINDOW, speech_spans

        try:
            check_rate(self.rate)
        except OasrError as exc:
            raise OasrError(f"request {request_id}: long-form cutting needs the VAD, and {exc}") from None
        audio = samples.numpy()
        vad_options = options.vad_options or VadOptions()
        probs = self.vad.probabilities(audio)
        if options.batched:
            return self._batched_plan(probs, n, options, request_id)
        silent = probs < vad_options.silence_threshold
        if options.vad_filter:
            spans = speech_spans(probs, n, vad_options, self.rate)
            silences = silences_of(spans, n, self.rate)
            if self.joins:
                return Plan([Piece(0, sum(s.end - s.start for s in spans))] if spans else [], silences, spans)
            regions = [(s.start, s.end) for s in spans]
        else:
            silences, regions = None, [(0, n)]
        pieces: list[Piece] = []
        if limit is None:
            pieces = [Piece(a, b) for a, b in regions]
        else:
            overlap = int(min(OVERLAP_SECONDS * self.rate, limit // 4))
            min_run = max(1, round(MIN_CUT_SILENCE_S * self.rate / WINDOW))
            for a, b in regions:
                pieces += cut_region(a, b, silent, limit=limit, overlap=overlap, align=self.align, window=WINDOW,
                                     min_run=min_run, rate=self.rate)
        return Plan(pieces, silences)

    def _batched_plan(self, probs: np.ndarray, n: int, options: DecodingOptions, request_id: str) -> Plan:
        from oasr.vad.spans import speech_spans

        if not self.joins or self.chunk_seconds is None:
            raise OasrError(f"request {request_id}: batched long-form needs a family that long-forms itself "
                            f"and a window to chunk the speech into")
        spans = speech_spans(probs, n, batched_vad_options(options.vad_options, self.chunk_seconds), self.rate)
        pieces, pos = [], 0
        for chunk in merge_spans(spans, int(self.chunk_seconds * self.rate)):
            size = sum(s.end - s.start for s in chunk)
            pieces.append(Piece(pos, pos + size, spans=tuple(chunk)))
            pos += size
        return Plan(pieces, silences_of(spans, n, self.rate), spans, batched=True)

    @staticmethod
    def piece_audio(audio: torch.Tensor, plan: Plan, piece: Piece) -> torch.Tensor:
        if piece.spans is not None:
            return torch.cat([audio[s.start:s.end] for s in piece.spans])
        if plan.joined is not None:
            return torch.cat([audio[s.start:s.end] for s in plan.joined])
        return audio[piece.start:piece.end]

    # -- stitching -------------------------------------------------------------------------------------
    def collect(self, child: Request, result: Hypothesis | BaseException) -> RequestOutput | None:
        """Record a piece's result; the parent's output once every piece has one."""
        parent = child.parent
        plan: Plan = parent.plan
        plan.results[child.piece] = result
        plan.remaining -= 1
        return self.output(parent) if plan.remaining == 0 else None

    def output(self, parent: Request) -> RequestOutput:
        plan: Plan = parent.plan
        duration = parent.duration
        for index, result in enumerate(plan.results):
            if isinstance(result, BaseException):
                piece = plan.pieces[index]
                failed = self.engine._to_output(parent, result)
                failed.error = (f"segment {index} ({piece.start / self.rate:.2f}-{piece.end / self.rate:.2f} s): "
                                f"{failed.error}")
                return failed
        from oasr.engine.outputs import build_output

        if plan.batched:
            hyp = self._unjoin(self._join_chunks(plan), plan.joined)
        elif plan.joined is not None:
            hyp = self._unjoin(plan.results[0], plan.joined) if plan.results else Hypothesis(tokens=[], text="",
                                                                                              segments=[])
        else:
            hyp = self._stitch(plan)
        output = build_output(parent.request_id, hyp, self.engine.tokenizer, parent.options, duration)
        output.silences = plan.silences
        return output

    def _stitch(self, plan: Plan) -> Hypothesis:
        tokenizer = self.engine.tokenizer
        tokens: list[int] = []
        words: list[WordTiming] = []
        segments: list[Segment] = []
        texts: list[str] = []
        from_tokens = True
        weighted, counted = 0.0, 0
        language = None
        for piece, hyp in zip(plan.pieces, plan.results, strict=True):
            offset = piece.start / self.rate
            kept = self._kept(hyp, piece, offset)
            piece_tokens = [hyp.tokens[i] for i in kept]
            piece_words = [attrs.evolve(w, start=round(w.start + offset, 3), end=round(w.end + offset, 3))
                           for w in (hyp.words or ()) if piece.keep_from <= w.start + offset < piece.keep_until]
            if hyp.text is not None and not piece.trimmed:
                text, from_tokens = hyp.text.strip(), False
            else:
                text = tokenizer.decode(piece_tokens).strip()
            tokens += piece_tokens
            words += piece_words
            if text:
                texts.append(text)
            if hyp.segments and not piece.trimmed:
                for seg in hyp.segments:
                    segments.append(attrs.evolve(seg, id=len(segments), start=round(seg.start + offset, 3),
                                                 end=round(seg.end + offset, 3), words=self._shift(seg.words, offset)))
            else:
                segments.append(Segment(len(segments), round(max(offset, piece.keep_from), 3),
                                        round(min(piece.end / self.rate, piece.keep_until), 3), text, piece_tokens,
                                        words=piece_words or None))
            if hyp.confidence is not None and piece_tokens:
                weighted += hyp.confidence * len(piece_tokens)
                counted += len(piece_tokens)
            language = language or hyp.language
        text = tokenizer.decode(tokens).strip() if from_tokens else " ".join(texts)
        return Hypothesis(tokens=tokens, text=text, words=words or None, segments=segments, language=language,
                          confidence=weighted / counted if counted else None)

    def _join_chunks(self, plan: Plan) -> Hypothesis:
        """The chunks' hypotheses as one over the joined speech (times shifted by each chunk's place)."""
        tokens: list[int] = []
        words: list[WordTiming] = []
        segments: list[Segment] | None = None
        weighted, counted, language = 0.0, 0, None
        for piece, hyp in zip(plan.pieces, plan.results, strict=True):
            offset = piece.start / self.rate
            tokens += hyp.tokens
            words += self._shift(hyp.words, offset) or []
            if hyp.segments is not None:
                segments = segments if segments is not None else []
                for seg in hyp.segments:
                    segments.append(attrs.evolve(seg, id=len(segments), start=round(seg.start + offset, 3),
                                                 end=round(seg.end + offset, 3), words=self._shift(seg.words, offset)))
            if hyp.confidence is not None and hyp.tokens:
                weighted += hyp.confidence * len(hyp.tokens)
                counted += len(hyp.tokens)
            language = language or hyp.language
        return Hypothesis(tokens=tokens, text=self.engine.tokenizer.decode(tokens).strip(), words=words or None,
                          segments=segments, language=language, confidence=weighted / counted if counted else None)

    def _kept(self, hyp: Hypothesis, piece: Piece, offset: float) -> list[int]:
        """Indices of the piece's tokens that are its own (not its overlapping neighbours')."""
        n = len(hyp.tokens)
        if not piece.trimmed:
            return list(range(n))
        if hyp.token_times is not None and len(hyp.token_times) == n:
            return [i for i, t in enumerate(hyp.token_times) if piece.keep_from <= t + offset < piece.keep_until]
        # no token times: keep the share of tokens that lies inside the kept span
        length = max(1, piece.end - piece.start)
        lo = max(0.0, (piece.keep_from - offset) * self.rate / length) if piece.keep_from != -math.inf else 0.0
        hi = min(1.0, (piece.keep_until - offset) * self.rate / length) if piece.keep_until != math.inf else 1.0
        return list(range(round(lo * n), round(hi * n)))

    @staticmethod
    def _shift(words: list[WordTiming] | None, offset: float) -> list[WordTiming] | None:
        if words is None:
            return None
        return [attrs.evolve(w, start=round(w.start + offset, 3), end=round(w.end + offset, 3)) for w in words]

    def _unjoin(self, hyp: Hypothesis, spans: list[SpeechSpan]) -> Hypothesis:
        """Times in the joined speech mapped back to the original audio (faster-whisper's rules: a word
        keeps the span of its middle; a segment without words maps its end as an end)."""
        times = _TimeMap(spans, self.rate)
        segments = None
        if hyp.segments is not None:
            segments = []
            for seg in hyp.segments:
                if seg.words:
                    mapped = []
                    for w in seg.words:
                        index = times.index((w.start + w.end) / 2)
                        mapped.append(attrs.evolve(w, start=times.original(w.start, index),
                                                   end=times.original(w.end, index)))
                    segments.append(attrs.evolve(seg, start=mapped[0].start, end=mapped[-1].end, words=mapped))
                else:
                    segments.append(attrs.evolve(seg, start=times.original(seg.start),
                                                 end=times.original(seg.end, is_end=True)))
        if segments is not None and hyp.words is not None:
            words = [w for seg in segments for w in (seg.words or ())]
        elif hyp.words is not None:
            words = [attrs.evolve(w, start=times.original(w.start, times.index((w.start + w.end) / 2)),
                                  end=times.original(w.end, times.index((w.start + w.end) / 2))) for w in hyp.words]
        else:
            words = None
        token_times = None
        if hyp.token_times is not None:
            token_times = [times.original(t) for t in hyp.token_times]
        return attrs.evolve(hyp, segments=segments, words=words, token_times=token_times, token_end_times=None)


class _TimeMap:
    """Seconds in the joined speech → seconds in the original audio."""

    def __init__(self, spans: list[SpeechSpan], rate: int):
        self.rate = rate
        self.ends: list[int] = []  # where each span ends in the joined audio (samples)
        self.silence_before: list[float] = []  # seconds removed before each span
        removed, previous = 0, 0
        for span in spans:
            removed += span.start - previous
            previous = span.end
            self.ends.append(span.end - removed)
            self.silence_before.append(removed / rate)

    def index(self, t: float, is_end: bool = False) -> int:
        sample = int(t * self.rate)
        if is_end and sample in self.ends:
            return self.ends.index(sample)
        return min(bisect.bisect(self.ends, sample), len(self.ends) - 1)

    def original(self, t: float, index: int | None = None, *, is_end: bool = False) -> float:
        if index is None:
            index = self.index(t, is_end)
        return round(self.silence_before[index] + t, 3)
