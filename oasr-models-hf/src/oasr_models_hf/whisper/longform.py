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
The thresholds, the schedule, conditioning, the initial prompt, suppressed tokens, clip ranges
(``clip_timestamps``) and the skipping of silence around likely hallucinations
(``hallucination_silence_threshold``) are per request (:class:`DecodingOptions`, whose defaults
are ``transcribe``'s).
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
    """Engine-level settings of the ``aed`` family (what one request asks is in :class:`DecodingOptions`)."""

    #: a temperature above this drops the previous text from the next window's prompt (openai-whisper: 0.5)
    prompt_reset_on_temperature: float = 0.5
    #: beam search rules: "openai" (openai-whisper, CTranslate2) or "transformers" (GenerationMixin)
    beam_style: Literal["openai", "transformers"] = "openai"
    #: windows decoded together (bounds the cross-attention K/V held at once)
    max_batch_windows: int = 16
    #: windows per encoder call (None: one on CPU, where a 30 s window already fills the caches and
    #: more only add memory traffic; all of a round elsewhere)
    encoder_batch: int | None = None


#: each request samples from its own generator seeded with this, so a transcript does not depend on
#: the batch it was decoded in, and equals openai-whisper's after ``torch.manual_seed(SAMPLING_SEED)``
SAMPLING_SEED = 0


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
    #: (start, end) mel frames of the audio to decode, in order
    clips: list[tuple[int, int]] = attrs.field(factory=list)
    clip_index: int = 0
    #: the ids suppressed at every step (None: the checkpoint's own set)
    suppress: tuple[int, ...] | None = None
    sot_sequence: list[int] = attrs.field(factory=list)
    language: str | None = None
    timestamps: bool = False
    initial_prompt: list[int] = attrs.field(factory=list)
    all_tokens: list[int] = attrs.field(factory=list)
    prompt_reset_since: int = 0
    seek: int = 0
    #: what a window at a temperature above zero samples from (the same request samples the same)
    generator: torch.Generator | None = None
    segments: list[Segment] = attrs.field(factory=list)
    sum_logprob: float = 0.0
    scored_tokens: int = 0
    nbest: list[Hypothesis] | None = None
    last_speech: float = 0.0
    error: BaseException | None = None

    @property
    def done(self) -> bool:
        return self.error is not None or self.clip_index >= len(self.clips)

    def settle(self) -> None:
        """Move ``seek`` into the current clip, or on to the next clip once this one is decoded."""
        while self.clip_index < len(self.clips):
            start, end = self.clips[self.clip_index]
            self.seek = max(self.seek, start)
            if self.seek < end:
                return
            self.clip_index += 1
            if self.clip_index < len(self.clips):
                self.seek = self.clips[self.clip_index][0]

    @property
    def clip_end(self) -> int:
        return self.clips[self.clip_index][1]


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
                       temperatures=tuple(options.temperature) or (0.0,), clips=self._clips(options, content),
                       suppress=self._suppress(options.suppress_tokens))
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
        # timestamp tokens unless asked not to; always past one window (they are where windows are cut),
        # and with word timings, which openai-whisper only computes over timestamped segments (decoding
        # without them and timing the words afterwards lets the model run on past the speech)
        req.timestamps = not options.without_timestamps or options.word_timestamps or content > self.window
        if options.n_best > 1 and content > self.window:
            raise RequestError("n_best > 1 is only available for audio of up to 30 s", param="n_best")
        prompt = options.initial_prompt or options.prompt
        if prompt:
            req.initial_prompt = self.tokenizer.encode(" " + prompt.strip())
            req.all_tokens = list(req.initial_prompt)
        if any(t > 0 for t in req.temperatures):
            req.generator = torch.Generator(device=mel.device).manual_seed(SAMPLING_SEED)
        req.settle()
        return req

    def _clips(self, options: DecodingOptions, content: int) -> list[tuple[int, int]]:
        """``clip_timestamps`` (seconds) as (start, end) mel frames; an odd last start runs to the end."""
        points = [round(t * self.frames_per_second) for t in options.clip_timestamps] or [0]
        if len(points) % 2:
            points.append(content)
        return [(start, min(end, content)) for start, end in zip(points[::2], points[1::2], strict=True)]

    def _suppress(self, tokens: tuple[int, ...]) -> tuple[int, ...] | None:
        """openai-whisper's ``suppress_tokens``: -1 stands for the checkpoint's non-speech set."""
        if tuple(tokens) == (-1,):
            return None
        listed = {t for t in tokens if t >= 0}
        if -1 in tokens:
            listed.update(self.gen.suppress_tokens)
        return tuple(sorted(listed))

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
        return [(codes[b], dict(zip(codes, row, strict=False))) for b, row in zip(best, probs.tolist(), strict=False)]

    # -- the loop ---------------------------------------------------------------------------------------
    def run(self, mels: list[torch.Tensor], options: list[DecodingOptions],
            on_segments=None) -> list[Hypothesis | BaseException]:
        """Decode every request; ``on_segments(row, segments, seconds_done, language)`` (DecodeBatch's) is
        told each round which segments became final."""
        self.encoder_seconds = 0.0
        requests: list[_Request] = []
        out: list[Hypothesis | BaseException | None] = [None] * len(mels)
        for i, (mel, opts) in enumerate(zip(mels, options, strict=False)):
            try:
                requests.append(self._prepare(i, mel, opts))
            except Exception as exc:  # a bad request fails alone
                out[i] = exc
        undetected = [r for r in requests if r.language is None]
        for start in range(0, len(undetected), self.settings.max_batch_windows):
            chunk = undetected[start:start + self.settings.max_batch_windows]
            first = torch.stack([r.mel[:, : self.window] for r in chunk])  # openai: the first 30 s, silence included
            for req, (code, _) in zip(chunk, self.detect_language(first), strict=False):
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
            beam_size=opts.beam_size if temperature == 0 else None,
            patience=1.0 if opts.patience is None else opts.patience, length_penalty=opts.length_penalty,
            max_new_tokens=opts.max_new_tokens or self.n_ctx // 2, beam_style=self.settings.beam_style,
            suppress=req.suppress, generator=req.generator)

    def _needs_fallback(self, result: WindowResult, opts: DecodingOptions) -> bool:
        text = self.tokenizer.decode(result.tokens).strip()
        too_repetitive = opts.compression_ratio_threshold is not None and \
            compression_ratio(text) > opts.compression_ratio_threshold
        too_improbable = opts.logprob_threshold is not None and result.avg_logprob < opts.logprob_threshold
        silent = (opts.no_speech_threshold is not None and opts.logprob_threshold is not None
                  and result.no_speech_prob > opts.no_speech_threshold and result.avg_logprob < opts.logprob_threshold)
        return (too_repetitive or too_improbable) and not silent

    @staticmethod
    def _best_sample(results: list[WindowResult], length_penalty: float | None) -> WindowResult:
        """openai-whisper's ranking of ``best_of`` samples: log-probability over length (or the NMT penalty)."""
        def score(r: WindowResult) -> float:
            n = len(r.tokens)
            penalty = n if length_penalty is None else ((5 + n) / 6) ** length_penalty
            return r.sum_logprob / penalty if penalty else float("-inf")

        return max(results, key=score)  # the first of equals, as openai's argmax

    def _decode_pending(self, batch: list[_Request], pending: list[int], attempt: int, cross_k, cross_v
                        ) -> list[WindowResult]:
        """One search over the pending windows at their ``attempt``-th temperature (``best_of`` rows each
        when sampling); the chosen result per window."""
        tasks, rows, copies = [], [], []
        for i in pending:
            req = batch[i]
            temperature = req.temperatures[attempt]
            n = (req.options.best_of or 1) if temperature > 0 else 1
            tasks.extend(self._task(req, temperature) for _ in range(n))
            rows.extend([i] * n)
            copies.append(n)
        if rows != list(range(len(batch))):
            index = torch.tensor(rows, device=cross_k[0].device)
            cross_k = [k.index_select(0, index) for k in cross_k]
            cross_v = [v.index_select(0, index) for v in cross_v]
        decoded = search_windows(self.model.decoder, cross_k, cross_v, tasks, self.gen)
        out, at = [], 0
        for i, n in zip(pending, copies, strict=True):
            group = decoded[at:at + n]
            out.append(group[0] if n == 1 else self._best_sample(group, batch[i].options.length_penalty))
            at += n
        return out

    def _round(self, batch: list[_Request]) -> None:
        sizes = [min(self.window, r.content_frames - r.seek, r.clip_end - r.seek) for r in batch]
        windows = torch.stack([
            torch.nn.functional.pad(r.mel[:, r.seek:r.seek + size], (0, self.window - size))
            for r, size in zip(batch, sizes, strict=True)
        ])
        enc = self._encode(windows)
        cross_k, cross_v = self.model.decoder.cross_kv(enc)
        results: list[WindowResult | None] = [None] * len(batch)
        pending = list(range(len(batch)))
        attempt = 0
        while pending:
            retry = []
            for i, result in zip(pending, self._decode_pending(batch, pending, attempt, cross_k, cross_v),
                                 strict=True):
                results[i] = result
                if attempt + 1 < len(batch[i].temperatures) and self._needs_fallback(result, batch[i].options):
                    retry.append(i)
            pending, attempt = retry, attempt + 1
        for i, (req, size, result) in enumerate(zip(batch, sizes, results, strict=True)):
            try:
                self._advance(req, size, result, enc[i])
            except Exception as exc:  # fails this request only
                req.error = exc
            req.settle()

    def _split(self, req: _Request, size: int, result: WindowResult) -> tuple[list[Segment], bool]:
        """The window's segments (cut at timestamp pairs) and whether it ends in a single timestamp;
        moves ``seek`` past what the window decoded."""
        gen = self.gen
        tokens = result.tokens
        ts_begin = gen.timestamp_begin
        window_seek = req.seek
        time_offset = req.seek * HOP_LENGTH / SAMPLE_RATE
        is_ts = [t >= ts_begin for t in tokens]
        single_ending = is_ts[-2:] == [False, True]
        cuts = [j + 1 for j in range(len(tokens) - 1) if is_ts[j] and is_ts[j + 1]]
        pieces: list[tuple[float, float, list[int]]] = []
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
        ratio = compression_ratio(self.tokenizer.decode(result.tokens).strip())
        segments = [Segment(id=0, start=start, end=end, text=self.tokenizer.decode([t for t in part if t < gen.eot_id]),
                            tokens=list(part), avg_logprob=result.avg_logprob, compression_ratio=ratio,
                            no_speech_prob=result.no_speech_prob, temperature=result.temperature, seek=window_seek)
                    for start, end, part in pieces]
        return segments, single_ending

    def _advance(self, req: _Request, size: int, result: WindowResult, enc: torch.Tensor) -> None:
        """Segments from one decoded window, and the next seek (openai-whisper's transcribe rules)."""
        opts = req.options
        if opts.no_speech_threshold is not None and result.no_speech_prob > opts.no_speech_threshold and not (
                opts.logprob_threshold is not None and result.avg_logprob > opts.logprob_threshold):
            req.seek += size  # silence: skip the window
            return
        previous_seek = req.seek
        time_offset = previous_seek * HOP_LENGTH / SAMPLE_RATE
        segments, single_ending = self._split(req, size, result)
        if opts.word_timestamps:
            from oasr_models_hf.whisper.timing import add_word_timestamps, last_end, skip_hallucinations

            add_word_timestamps(self.model, self.tokenizer, enc, segments, sot_sequence=req.sot_sequence,
                                num_frames=size, time_offset=time_offset, last_speech=req.last_speech,
                                language=req.language)
            end = last_end(segments)
            if not single_ending and end is not None and end > time_offset:
                req.seek = round(end * self.frames_per_second)
            if opts.hallucination_silence_threshold is not None:
                seek, keep = skip_hallucinations(
                    segments, threshold=opts.hallucination_silence_threshold, seek=req.seek,
                    previous_seek=previous_seek, size=size, single_ending=single_ending,
                    last_speech=req.last_speech, content_frames=req.content_frames,
                    frames_per_second=self.frames_per_second, window_frames=self.window)
                req.seek = seek
                if not keep:
                    return
            end = last_end(segments)
            if end is not None:
                req.last_speech = end
        for seg in segments:
            if seg.start == seg.end or not seg.text.strip():
                # an instantaneous or textless segment carries nothing: left out, as faster-whisper leaves it
                # (openai-whisper keeps it with its text, tokens and words cleared); a short last window
                # that decodes a run of repeated timestamps would otherwise end the list with a dozen
                continue
            seg.id = len(req.segments)
            req.segments.append(seg)
            req.all_tokens.extend(seg.tokens)
        req.sum_logprob += result.sum_logprob
        req.scored_tokens += len(result.tokens) + 1
        if not opts.condition_on_previous_text or result.temperature > self.settings.prompt_reset_on_temperature:
            req.prompt_reset_since = len(req.all_tokens)
        req.settle()
        if len(result.candidates) > 1 and opts.n_best > 1 and previous_seek == 0 and req.done:
            req.nbest = [self._candidate(c.tokens, c.sum_logprob) for c in result.candidates[:opts.n_best]]

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
        # without ``timestamps`` the output leaves the timed segments out (one segment spans the audio)
        return Hypothesis(tokens=text_tokens, score=req.sum_logprob, text=self.tokenizer.decode(text_tokens).strip(),
                          segments=req.segments if req.options.timestamps else None, language=req.language,
                          confidence=confidence, nbest=req.nbest,
                          words=[w for seg in req.segments for w in (seg.words or ())] or None)
