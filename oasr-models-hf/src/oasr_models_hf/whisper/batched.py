"""Batched long-form chunks: faster-whisper's ``BatchedInferencePipeline`` decoding of one chunk each.

With ``DecodingOptions.batched`` the engine's long-form planner hands the strategy chunks of joined
VAD speech of up to 30 s, each a request of its own (see ``oasr.engine.longform``).  A chunk is
decoded once, on its own, as faster-whisper's batched pipeline decodes it:

- features: the log-mel of the chunk alone (160 zero samples appended, normalised over the chunk),
  its last frame dropped, zero-padded to the 30 s window;
- language: on a multilingual checkpoint, when not given, detected once per request
  (:func:`request_language`, at admission) over the first window of its chunks' features joined in
  order, as the pipeline detects it; a chunk decoded outside the engine without one detects its own;
- prompt: ``<|startofprev|>`` and the ``initial_prompt`` tokens (encoded as given, no leading space)
  when there is one, the SOT sequence, and ``<|notimestamps|>`` unless ``without_timestamps=False``;
- search: the first temperature of the schedule only (greedy or beam at 0), no fallback, no
  no-speech skipping, no previous text; at most the text context's positions (CTranslate2's
  ``max_length``) unless ``max_new_tokens`` says fewer;
- segments: cut at timestamp pairs as faster-whisper's ``_split_segments_by_timestamps`` cuts them
  (an unfinished last segment after a timestamp pair is dropped, as there); without timestamps one
  segment spans the chunk.  Word timings (``word_timestamps``) are aligned per chunk.

Times are relative to the chunk; the planner shifts and maps them to the original audio.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

from oasr.decoding.types import Hypothesis, Segment
from oasr.engine.options import DecodingOptions
from oasr.errors import RequestError
from oasr.features.whisper import log_mel
from oasr_models_hf.whisper.config import HOP_LENGTH, SAMPLE_RATE
from oasr_models_hf.whisper.longform import compression_ratio
from oasr_models_hf.whisper.search import WindowResult, WindowTask, search_windows

if TYPE_CHECKING:
    from oasr_models_hf.whisper.longform import Transcriber

#: DecodingOptions fields batched long-form refuses (faster-whisper's batched pipeline has no use for them)
REFUSED = {"n_best": "n_best > 1", "clip_timestamps": "clip_timestamps",
           "hallucination_silence_threshold": "hallucination_silence_threshold"}


def check_options(options: DecodingOptions, request_id: str | None = None) -> None:
    """Refuse what batched long-form cannot honour, naming the option."""
    default = DecodingOptions()
    for name, shown in REFUSED.items():
        if getattr(options, name) != getattr(default, name):
            raise RequestError(f"{shown} is not available with batched long-form (each chunk of speech is decoded "
                               f"once, on its own); drop batched=True or the option", request_id=request_id,
                               param=name)


#: the log-mel frame the batched pipeline appends to the joined features before detecting the language
#: (its stand-in for a request without speech); it is inside the detected window when the speech is shorter
EMPTY_FRAME_VALUE = -1.5


def _unpadded_features(wave: torch.Tensor, n_mels: int) -> torch.Tensor:
    return log_mel(wave.reshape(-1).float(), n_mels, padding_samples=HOP_LENGTH)[:, :-1]


def chunk_features(wave: torch.Tensor, n_mels: int, window: int) -> torch.Tensor:
    """(n_mels, window) features of one chunk, as the batched pipeline builds them."""
    mel = _unpadded_features(wave, n_mels)[:, :window]
    return torch.nn.functional.pad(mel, (0, window - mel.shape[-1]))


def request_language(transcriber: Transcriber, chunks: Iterable[torch.Tensor]) -> str:
    """The language of one batched long-form request, detected once as the batched pipeline detects it:
    every chunk's features (as :func:`chunk_features` makes them, unpadded) joined in order, one frame of
    ``EMPTY_FRAME_VALUE`` appended, the first window of that zero-padded to the window."""
    model = transcriber.model
    device = next(model.parameters()).device
    window, n_mels = transcriber.window, model.config.num_mel_bins
    parts, frames = [], 0
    for wave in chunks:
        if frames >= window:
            break
        parts.append(_unpadded_features(wave.to(device), n_mels))
        frames += parts[-1].shape[-1]
    parts.append(torch.full((n_mels, 1), EMPTY_FRAME_VALUE, device=device))
    mel = torch.cat(parts, dim=-1)[:, :window]
    mel = torch.nn.functional.pad(mel, (0, window - mel.shape[-1]))
    return transcriber.detect_language(mel[None])[0][0]


def decode_chunks(transcriber: Transcriber, waveforms: list[torch.Tensor],
                  options: list[DecodingOptions]) -> list[Hypothesis | BaseException]:
    """Decode every chunk once; a chunk that fails fails alone."""
    model, gen = transcriber.model, transcriber.gen
    device = next(model.parameters()).device
    window = transcriber.window
    out: list[Hypothesis | BaseException | None] = [None] * len(waveforms)
    mels = torch.stack([chunk_features(w.to(device), model.config.num_mel_bins, window) for w in waveforms])
    languages: list[str | None] = [o.language if gen.is_multilingual else "en" for o in options]
    undetected = [i for i, lang in enumerate(languages) if lang is None]
    if undetected:
        for i, (code, _) in zip(undetected, transcriber.detect_language(mels[undetected]), strict=True):
            languages[i] = code
    enc = transcriber._encode(mels)
    cross_k, cross_v = model.decoder.cross_kv(enc)
    tasks, sot_sequences = [], []
    for i, opts in enumerate(options):
        try:
            task, sot = _task(transcriber, opts, languages[i])
        except Exception as exc:  # a bad request fails alone
            out[i] = exc
            task, sot = None, []
        tasks.append(task)
        sot_sequences.append(sot)
    rows = [i for i, t in enumerate(tasks) if t is not None]
    if rows:
        if len(rows) < len(tasks):
            index = torch.tensor(rows, device=device)
            cross_k = [k.index_select(0, index) for k in cross_k]
            cross_v = [v.index_select(0, index) for v in cross_v]
        results = search_windows(model.decoder, cross_k, cross_v, [tasks[i] for i in rows], gen)
        for i, result in zip(rows, results, strict=True):
            seconds = waveforms[i].numel() / SAMPLE_RATE
            try:
                out[i] = _hypothesis(transcriber, result, options[i], seconds, enc[i], sot_sequences[i], languages[i])
            except Exception as exc:
                out[i] = exc
    return out  # type: ignore[return-value]


def _task(transcriber: Transcriber, opts: DecodingOptions, language: str | None) -> tuple[WindowTask, list[int]]:
    gen, n_ctx = transcriber.gen, transcriber.n_ctx
    if gen.is_multilingual:
        gen.language_id(language)  # raises naming the known codes
        task_id = gen.translate_id if opts.task == "translate" else gen.transcribe_id
        sot = [gen.sot_id, gen.language_id(language), task_id]
    else:
        sot = [gen.sot_id]
    timestamps = opts.without_timestamps is False
    prompt: list[int] = []
    text = opts.initial_prompt or opts.prompt
    if text:
        prompt = [gen.sot_prev_id, *transcriber.tokenizer.encode(text)[-(n_ctx // 2 - 1):]]
    full = prompt + sot + ([] if timestamps else [gen.no_timestamps_id])
    if opts.max_new_tokens is not None and len(full) + opts.max_new_tokens > n_ctx:
        raise RequestError(f"the prompt is {len(full)} tokens and max_new_tokens={opts.max_new_tokens}: together "
                           f"past Whisper's {n_ctx} text positions", param="max_new_tokens")
    temperature = (tuple(opts.temperature) or (0.0,))[0]
    generator = None
    if temperature > 0:
        from oasr_models_hf.whisper.longform import SAMPLING_SEED

        generator = torch.Generator(device=next(transcriber.model.parameters()).device).manual_seed(SAMPLING_SEED)
    task = WindowTask(
        prompt=full, sot_index=len(prompt), timestamps=timestamps, temperature=temperature,
        beam_size=opts.beam_size if temperature == 0 else None,
        patience=1.0 if opts.patience is None else opts.patience, length_penalty=opts.length_penalty,
        max_new_tokens=opts.max_new_tokens or n_ctx - len(full), beam_style=transcriber.settings.beam_style,
        suppress=transcriber._suppress(opts.suppress_tokens), generator=generator)
    return task, sot


def split_segments(transcriber: Transcriber, tokens: list[int], seconds: float) -> list[tuple[float, float, list[int]]]:
    """(start, end, tokens) of a chunk's segments: cut after every timestamp pair (and at a single
    closing timestamp); an unfinished segment after the last pair is dropped."""
    ts_begin, precision = transcriber.gen.timestamp_begin, transcriber.time_precision
    is_ts = [t >= ts_begin for t in tokens]
    cuts = [j for j in range(1, len(tokens)) if is_ts[j] and is_ts[j - 1]]
    if not cuts:
        stamps = [t for t in tokens if t >= ts_begin]
        end = seconds
        if stamps and stamps[-1] != ts_begin:
            end = (stamps[-1] - ts_begin) * precision
        return [(0.0, end, tokens)]
    if len(tokens) >= 2 and tokens[-2] < ts_begin <= tokens[-1]:
        cuts.append(len(tokens))
    out, last = [], 0
    for cut in cuts:
        part = tokens[last:cut]
        out.append(((part[0] - ts_begin) * precision, (part[-1] - ts_begin) * precision, part))
        last = cut
    return out


def _hypothesis(transcriber: Transcriber, result: WindowResult, opts: DecodingOptions, seconds: float,
                enc: torch.Tensor, sot: list[int], language: str | None) -> Hypothesis:
    tokenizer, eot = transcriber.tokenizer, transcriber.gen.eot_id
    segments = []
    for start, end, part in split_segments(transcriber, result.tokens, seconds):
        text_tokens = [t for t in part if t < eot]
        text = tokenizer.decode(text_tokens)
        segments.append(Segment(id=len(segments), start=round(start, 3), end=round(end, 3), text=text,
                                tokens=list(part), avg_logprob=result.avg_logprob,
                                compression_ratio=compression_ratio(text), no_speech_prob=result.no_speech_prob,
                                temperature=result.temperature))
    if opts.word_timestamps:
        from oasr_models_hf.whisper.timing import add_word_timestamps

        frames = math.ceil(seconds) * (SAMPLE_RATE // HOP_LENGTH)
        add_word_timestamps(transcriber.model, tokenizer, enc, segments, sot_sequence=sot,
                            num_frames=min(frames, transcriber.window), time_offset=0.0, last_speech=0.0,
                            language=language)
    text_tokens = [t for seg in segments for t in seg.tokens if t < eot]
    for seg in segments:
        seg.text = seg.text.strip()
        seg.tokens = [t for t in seg.tokens if t < eot]
    confidence = math.exp(result.avg_logprob) if result.tokens else None
    return Hypothesis(tokens=text_tokens, score=result.sum_logprob, text=tokenizer.decode(text_tokens).strip(),
                      segments=segments if opts.timestamps else None, language=language, confidence=confidence,
                      words=[w for seg in segments for w in (seg.words or ())] or None)
