"""Whisper transcription of audio of any length, batched across requests.

This is openai-whisper's ``transcribe`` loop run for many requests at once.  Each request carries
the log-mel of its whole audio followed by 30 s of silence (the same features ``transcribe`` slices)
and a seek position.  Every round takes the next window of every unfinished request, encodes them
in one batch and decodes them in one :func:`search_windows` call, each window with its own prompt
(the request's previous text when conditioning on it, its language and task).  Then, per request,
the window's tokens are cut into segments at timestamp pairs and the seek moves as ``transcribe``
moves it: to the last timestamp, or past the window when it ends in a single timestamp or carries
none.  Audio of up to 30 s is the one-window case of the same loop.

Per window, a result that is too repetitive (gzip compression ratio above the threshold) or too
improbable (average log-probability below it) is decoded again at the request's next temperature;
a window whose no-speech probability is high and whose text is improbable is skipped as silence.
"""

from __future__ import annotations

import math
import time
import zlib
from typing import Any, Literal

import attrs
import torch

from oasr.decoding.types import Hypothesis, Segment
from oasr.engine.options import DecodingOptions
from oasr.errors import RequestError
from oasr_models_hf.whisper.config import HOP_LENGTH, SAMPLE_RATE, WhisperGeneration
from oasr_models_hf.whisper.model import WhisperModel
from oasr_models_hf.whisper.search import WindowResult, WindowTask, search_windows


@attrs.define
class AedOptions:
    """Engine-level settings of the ``aed`` family (openai-whisper ``transcribe`` defaults)."""

    compression_ratio_threshold: float | None = 2.4
    logprob_threshold: float | None = -1.0
    no_speech_threshold: float | None = 0.6
    condition_on_previous_text: bool = True
    #: a temperature above this drops the previous text from the next window's prompt
    prompt_reset_on_temperature: float = 0.5
    length_penalty: float | None = None
    patience: float = 1.0
    #: beam search rules: "openai" (openai-whisper, CTranslate2) or "transformers" (GenerationMixin)
    beam_style: Literal["openai", "transformers"] = "openai"
    #: windows decoded together (bounds the cross-attention K/V held at once)
    max_batch_windows: int = 16
    #: windows per encoder call (None: one on CPU, where a 30 s window already fills the caches and
    #: more only add memory traffic; all of a round elsewhere)
    encoder_batch: int | None = None


def compression_ratio(text: str) -> float:
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


@attrs.define(eq=False)
class _Request:
    """The transcription state of one request."""

    index: int
    mel: torch.Tensor  # (n_mels, content_frames + window)
    content_frames: int
    options: DecodingOptions
    temperatures: tuple[float, ...]
    sot_sequence: list[int] = attrs.field(factory=list)
    language: str | None = None
    timestamps: bool = False
    initial_prompt: list[int] = attrs.field(factory=list)
    all_tokens: list[int] = attrs.field(factory=list)
    prompt_reset_since: int = 0
    seek: int = 0
    segments: list[Segment] = attrs.field(factory=list)
    sum_logprob: float = 0.0
    scored_tokens: int = 0
    nbest: list[Hypothesis] | None = None
    last_speech: float = 0.0
    error: BaseException | None = None

    @property
    def done(self) -> bool:
        return self.error is not None or self.seek >= self.content_frames


class Transcriber:
    """Decodes batches of requests (log-mel of whole audio + 30 s of silence) into hypotheses."""

    def __init__(self, model: WhisperModel, tokenizer: Any, settings: AedOptions | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.settings = settings or AedOptions()
        self.gen: WhisperGeneration = model.config.generation
        self.window = model.config.input_frames
        self.n_ctx = model.config.max_target_positions
        #: seconds per timestamp step = seconds per encoder frame
        self.time_precision = self.gen.time_precision
        self.frames_per_second = SAMPLE_RATE // HOP_LENGTH
        #: seconds spent encoding during the last :meth:`run` (the rest of it is decoding)
        self.encoder_seconds = 0.0

    # -- request set-up ---------------------------------------------------------------------------------
    def _prepare(self, index: int, mel: torch.Tensor, options: DecodingOptions) -> _Request:
        content = mel.shape[-1] - self.window
        if content < 0:
            raise RequestError(f"log-mel of {mel.shape[-1]} frames is shorter than the {self.window}-frame silence "
                               f"it must end with")
        req = _Request(index=index, mel=mel, content_frames=content, options=options,
                       temperatures=tuple(options.temperature) or (0.0,))
        gen = self.gen
        if not gen.is_multilingual:
            if options.language not in (None, "en"):
                raise RequestError(f"this Whisper checkpoint is English-only; it cannot take language "
                                   f"{options.language!r}", param="language")
            if options.task == "translate":
                raise RequestError("this Whisper checkpoint is English-only; it cannot translate", param="task")
            req.language = "en"
        elif options.language is not None:
            gen.language_id(options.language)  # raises naming the known codes
            req.language = options.language
        # timestamp tokens: when asked for, always past one window (they are where windows are cut), and
        # with word timings, which openai-whisper only computes over timestamped segments (decoding
        # without them and timing the words afterwards lets the model run on past the speech)
        req.timestamps = options.timestamps or options.word_timestamps or content > self.window
        if options.n_best > 1 and content > self.window:
            raise RequestError("n_best > 1 is only available for audio of up to 30 s", param="n_best")
        if options.prompt:
            req.initial_prompt = self.tokenizer.encode(" " + options.prompt.strip())
            req.all_tokens = list(req.initial_prompt)
        return req

    def _sot_sequence(self, req: _Request) -> list[int]:
        gen = self.gen
        if not gen.is_multilingual:
            return [gen.sot_id]
        task = gen.translate_id if req.options.task == "translate" else gen.transcribe_id
        return [gen.sot_id, gen.language_id(req.language), task]

    # -- language detection -----------------------------------------------------------------------------
    def detect_language(self, mels: torch.Tensor) -> list[tuple[str, dict[str, float]]]:
        """Most probable language of each first window (N, n_mels, frames), with every language's probability."""
        gen = self.gen
        enc = self._encode(mels)
        decoder = self.model.decoder
        tokens = torch.full((mels.shape[0], 1), gen.sot_id, dtype=torch.long, device=enc.device)
        _, hidden = decoder.prefill(enc, tokens)
        logits = decoder.logits(hidden[:, 0]).float()
        codes = list(gen.languages)
        ids = torch.tensor([gen.languages[c] for c in codes], device=logits.device)
        probs = logits[:, ids].softmax(dim=-1)  # the softmax over language tokens only
        best = probs.argmax(dim=-1).tolist()
        return [(codes[b], dict(zip(codes, row))) for b, row in zip(best, probs.tolist())]

    # -- the loop ---------------------------------------------------------------------------------------
    def run(self, mels: list[torch.Tensor], options: list[DecodingOptions],
            on_segments=None) -> list[Hypothesis | BaseException]:
        """Decode every request; ``on_segments(row, segments, seconds_done, language)`` (DecodeBatch's) is
        told each round which segments became final."""
        self.encoder_seconds = 0.0
        requests: list[_Request] = []
        out: list[Hypothesis | BaseException | None] = [None] * len(mels)
        for i, (mel, opts) in enumerate(zip(mels, options)):
            try:
                requests.append(self._prepare(i, mel, opts))
            except Exception as exc:  # a bad request fails alone
                out[i] = exc
        undetected = [r for r in requests if r.language is None]
        for start in range(0, len(undetected), self.settings.max_batch_windows):
            chunk = undetected[start:start + self.settings.max_batch_windows]
            first = torch.stack([r.mel[:, : self.window] for r in chunk])  # openai: the first 30 s, silence included
            for req, (code, _) in zip(chunk, self.detect_language(first)):
                req.language = code
        for req in requests:
            req.sot_sequence = self._sot_sequence(req)
        active = [r for r in requests if not r.done]
        reported: dict[int, int] = {}
        while active:
            for start in range(0, len(active), self.settings.max_batch_windows):
                self._round(active[start:start + self.settings.max_batch_windows])
            if on_segments is not None:
                for r in active:
                    if r.error is None:
                        new, reported[r.index] = r.segments[reported.get(r.index, 0):], len(r.segments)
                        on_segments(r.index, new, min(r.seek, r.content_frames) * HOP_LENGTH / SAMPLE_RATE,
                                    r.language)
            active = [r for r in active if not r.done]
        for req in requests:
            out[req.index] = req.error if req.error is not None else self._hypothesis(req)
        return out  # type: ignore[return-value]

    def _encode(self, windows: torch.Tensor) -> torch.Tensor:
        """Encoder output (N, S, D) of log-mel windows (N, n_mels, frames)."""
        model = self.model
        t0 = time.perf_counter()
        step = self.settings.encoder_batch or (1 if windows.device.type == "cpu" else windows.shape[0])
        feats = windows.to(model.compute_dtype).transpose(1, 2)
        out = torch.cat([model.encode_offline(feats[i:i + step])[0] for i in range(0, feats.shape[0], step)])
        self.encoder_seconds += time.perf_counter() - t0
        return out

    def _task(self, req: _Request, temperature: float) -> WindowTask:
        prompt: list[int] = []
        previous = req.all_tokens[req.prompt_reset_since:]
        if previous:
            prompt = [self.gen.sot_prev_id, *previous[-(self.n_ctx // 2 - 1):]]
        sot = list(req.sot_sequence)
        if not req.timestamps:
            sot.append(self.gen.no_timestamps_id)
        opts = req.options
        return WindowTask(
            prompt=prompt + sot, sot_index=len(prompt), timestamps=req.timestamps, temperature=temperature,
            beam_size=opts.beam_size if temperature == 0 else None, patience=self.settings.patience,
            length_penalty=self.settings.length_penalty, max_new_tokens=opts.max_new_tokens or self.n_ctx // 2,
            beam_style=self.settings.beam_style)

    def _needs_fallback(self, result: WindowResult) -> bool:
        s = self.settings
        text = self.tokenizer.decode(result.tokens).strip()
        too_repetitive = s.compression_ratio_threshold is not None and \
            compression_ratio(text) > s.compression_ratio_threshold
        too_improbable = s.logprob_threshold is not None and result.avg_logprob < s.logprob_threshold
        silent = (s.no_speech_threshold is not None and s.logprob_threshold is not None
                  and result.no_speech_prob > s.no_speech_threshold and result.avg_logprob < s.logprob_threshold)
        return (too_repetitive or too_improbable) and not silent

    def _round(self, batch: list[_Request]) -> None:
        sizes = [min(self.window, r.content_frames - r.seek) for r in batch]
        windows = torch.stack([
            torch.nn.functional.pad(r.mel[:, r.seek:r.seek + size], (0, self.window - size))
            for r, size in zip(batch, sizes)
        ])
        enc = self._encode(windows)
        cross_k, cross_v = self.model.decoder.cross_kv(enc)
        model = self.model
        results: list[WindowResult | None] = [None] * len(batch)
        pending = list(range(len(batch)))
        attempt = 0
        while pending:
            tasks = [self._task(batch[i], batch[i].temperatures[attempt]) for i in pending]
            index = torch.tensor(pending, device=enc.device)
            sub_k = [k.index_select(0, index) for k in cross_k] if len(pending) < len(batch) else cross_k
            sub_v = [v.index_select(0, index) for v in cross_v] if len(pending) < len(batch) else cross_v
            decoded = search_windows(model.decoder, sub_k, sub_v, tasks, self.gen)
            retry = []
            for i, result in zip(pending, decoded):
                results[i] = result
                if attempt + 1 < len(batch[i].temperatures) and self._needs_fallback(result):
                    retry.append(i)
            pending, attempt = retry, attempt + 1
        for i, (req, size, result) in enumerate(zip(batch, sizes, results)):
            try:
                self._advance(req, size, result, enc[i])
            except Exception as exc:  # fails this request only
                req.error = exc

    def _advance(self, req: _Request, size: int, result: WindowResult, enc: torch.Tensor) -> None:
        """Segments from one decoded window, and the next seek (openai-whisper's transcribe rules)."""
        s, gen = self.settings, self.gen
        if s.no_speech_threshold is not None and result.no_speech_prob > s.no_speech_threshold and not (
                s.logprob_threshold is not None and result.avg_logprob > s.logprob_threshold):
            req.seek += size  # silence: skip the window
            return
        tokens = result.tokens
        ts_begin = gen.timestamp_begin
        time_offset = req.seek * HOP_LENGTH / SAMPLE_RATE
        is_ts = [t >= ts_begin for t in tokens]
        single_ending = is_ts[-2:] == [False, True]
        cuts = [j + 1 for j in range(len(tokens) - 1) if is_ts[j] and is_ts[j + 1]]
        pieces: list[tuple[float, float, list[int]]] = []
        previous_seek = req.seek
        if cuts:
            if single_ending:
                cuts.append(len(tokens))
            last = 0
            for cut in cuts:
                part = tokens[last:cut]
                pieces.append((time_offset + (part[0] - ts_begin) * self.time_precision,
                               time_offset + (part[-1] - ts_begin) * self.time_precision, part))
                last = cut
            if single_ending:
                req.seek += size
            else:
                req.seek += (tokens[last - 1] - ts_begin) * (self.window // self.model.config.max_source_positions)
        else:
            duration = size * HOP_LENGTH / SAMPLE_RATE
            stamps = [t for t in tokens if t >= ts_begin]
            if stamps and stamps[-1] != ts_begin:
                duration = (stamps[-1] - ts_begin) * self.time_precision
            pieces.append((time_offset, time_offset + duration, tokens))
            req.seek += size
        segments = []
        for start, end, part in pieces:
            text = self.tokenizer.decode([t for t in part if t < gen.eot_id])
            segments.append(Segment(id=0, start=start, end=end, text=text, tokens=list(part),
                                    avg_logprob=result.avg_logprob,
                                    compression_ratio=compression_ratio(self.tokenizer.decode(result.tokens).strip()),
                                    no_speech_prob=result.no_speech_prob, temperature=result.temperature))
        if req.options.word_timestamps:
            from oasr_models_hf.whisper.timing import add_word_timestamps

            add_word_timestamps(self.model, self.tokenizer, enc, segments, sot_sequence=req.sot_sequence,
                                num_frames=size, time_offset=time_offset, last_speech=req.last_speech,
                                language=req.language)
            ends = [w.end for seg in segments for w in (seg.words or ())]
            last_end = ends[-1] if ends else (segments[-1].end if segments else None)
            if not single_ending and last_end is not None and last_end > time_offset:
                req.seek = round(last_end * self.frames_per_second)
            if last_end is not None:
                req.last_speech = last_end
        for seg in segments:  # an instantaneous or empty segment carries nothing
            if seg.start == seg.end or not seg.text.strip():
                seg.text, seg.tokens, seg.words = "", [], []
        for seg in segments:
            seg.id = len(req.segments)
            req.segments.append(seg)
            req.all_tokens.extend(seg.tokens)
        req.sum_logprob += result.sum_logprob
        req.scored_tokens += len(result.tokens) + 1
        if not self.settings.condition_on_previous_text or result.temperature > s.prompt_reset_on_temperature:
            req.prompt_reset_since = len(req.all_tokens)
        if len(result.candidates) > 1 and req.options.n_best > 1 and previous_seek == 0 and req.done:
            req.nbest = [self._candidate(c.tokens, c.sum_logprob) for c in result.candidates[:req.options.n_best]]

    def _candidate(self, tokens: list[int], score: float) -> Hypothesis:
        text_tokens = [t for t in tokens if t < self.gen.eot_id]
        return Hypothesis(tokens=text_tokens, score=score, text=self.tokenizer.decode(text_tokens).strip())

    def _hypothesis(self, req: _Request) -> Hypothesis:
        eot = self.gen.eot_id
        spoken = req.all_tokens[len(req.initial_prompt):]
        text_tokens = [t for t in spoken if t < eot]
        for seg in req.segments:
            seg.text = seg.text.strip()
            seg.tokens = [t for t in seg.tokens if t < eot]
        confidence = math.exp(req.sum_logprob / req.scored_tokens) if req.scored_tokens else None
        return Hypothesis(tokens=text_tokens, score=req.sum_logprob, text=self.tokenizer.decode(text_tokens).strip(),
                          segments=req.segments, language=req.language, confidence=confidence, nbest=req.nbest,
                          words=[w for seg in req.segments for w in (seg.words or ())] or None)
