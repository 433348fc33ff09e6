"""Word timestamps for Whisper: cross-attention of the alignment heads, aligned to the audio by DTW.

For one decoded window, the text tokens are fed teacher-forced once more (``<|startoftranscript|>``
sequence, ``<|notimestamps|>``, the text, end-of-text) and the cross-attention probabilities of the
checkpoint's alignment heads over the window's real frames are taken
(:meth:`WhisperDecoder.cross_attention`).  Each head's map is standardized over tokens, median
filtered over time (width 7) and the heads are averaged; dynamic time warping through the negated
map gives each token the encoder frame (20 ms) where the path first reaches it.  Words are the
tokens grouped at spaces and punctuation (at every complete character for languages written
without spaces); a word starts where its first token's path starts and ends where the next word's
starts, and its confidence is the mean probability of its tokens.  The clean-ups are openai-whisper's:
punctuation merged into neighbouring words, over-long words at sentence and segment boundaries
clipped to twice the median word duration, and segment bounds moved to the words' bounds.
"""

from __future__ import annotations

import string
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from oasr.decoding.types import Segment, WordTiming
from oasr_models_hf.whisper.model import WhisperDecoder, WhisperModel

PREPEND_PUNCTUATION = "\"'“¿([{-"
APPEND_PUNCTUATION = "\"'.。,，!！?？:：”)]}、"
SENTENCE_END = ".。!！?？"
#: languages written without spaces between words: split at every complete character instead
NO_SPACE_LANGUAGES = frozenset({"zh", "ja", "th", "lo", "my", "yue"})
MEDIAN_FILTER_WIDTH = 7


#: token rows processed at a time by :func:`median_filter`: a window's sliding copies, sorted values and
#: int64 indices stay a few MB (~250 MB for 224 tokens at once)
BLOCK_ROWS = 16
#: token rows projected onto the vocabulary at a time for their probabilities (13 MB of float32 logits on a
#: 51,864-token vocabulary; the GEMM's weights are read once per block)
PROB_ROWS = 64


def median_filter(x: torch.Tensor, width: int) -> torch.Tensor:
    """Median over a sliding window of ``width`` (odd) along the last axis, reflect-padded at the ends."""
    half = width // 2
    if x.shape[-1] <= half:
        return x
    padded = F.pad(x[None] if x.dim() == 2 else x, (half, half), mode="reflect")
    out = padded.new_empty(*padded.shape[:-1], x.shape[-1])
    for row in range(0, padded.shape[-2], BLOCK_ROWS):
        rows = padded[..., row:row + BLOCK_ROWS, :]
        out[..., row:row + BLOCK_ROWS, :] = rows.unfold(-1, width, 1).sort(dim=-1).values[..., half]
    return out[0] if x.dim() == 2 else out


def dtw(cost_matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Minimum-cost monotonic path through ``cost_matrix`` (N, M) from (0, 0) to (N-1, M-1).

    Returns the (row, column) indices along the path.  Each cell extends the cheapest of its
    diagonal, upper and left neighbours (ties resolved left); costs accumulate in float32.  The
    anti-diagonals are computed one at a time, each as a whole vector.
    """
    n, m = cost_matrix.shape
    cost = np.full((n + 1, m + 1), np.inf, dtype=np.float32)
    cost[0, 0] = 0.0
    trace = np.full((n + 1, m + 1), -1, dtype=np.int8)
    for diagonal in range(2, n + m + 1):
        i = np.arange(max(1, diagonal - m), min(n, diagonal - 1) + 1)
        j = diagonal - i
        diag, up, left = cost[i - 1, j - 1], cost[i - 1, j], cost[i, j - 1]
        step = np.where((diag < up) & (diag < left), 0, np.where((up < diag) & (up < left), 1, 2))
        best = np.choose(step, [diag, up, left])
        cost[i, j] = cost_matrix[i - 1, j - 1] + best
        trace[i, j] = step
    trace[0, :] = 2
    trace[:, 0] = 1
    i, j = n, m
    path = []
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        t = trace[i, j]
        if t == 0:
            i, j = i - 1, j - 1
        elif t == 1:
            i -= 1
        else:
            j -= 1
    rows, cols = np.array(path[::-1]).T
    return rows, cols


def split_words(tokenizer: Any, tokens: list[int], eot: int, language: str | None) -> tuple[list[str], list[list[int]]]:
    """Group ``tokens`` (text tokens, then end-of-text) into words and their tokens."""
    text = [t for t in tokens if t != eot]
    pieces = tokenizer.token_pieces(text) if text else []
    units: list[tuple[str, list[int]]] = []
    pending: list[int] = []
    for token, piece in zip(text, pieces, strict=False):
        pending.append(token)
        if piece:  # a complete character (or more): one unit
            units.append((piece, pending))
            pending = []
    if pending:
        units.append(("", pending))
    units.append(("<|endoftext|>", [eot]))
    if language in NO_SPACE_LANGUAGES:
        return [u[0] for u in units], [list(u[1]) for u in units]
    words: list[str] = []
    word_tokens: list[list[int]] = []
    for piece, unit in units:
        special = unit[0] >= eot
        if special or piece.startswith(" ") or piece.strip() in string.punctuation or not words:
            words.append(piece)
            word_tokens.append(list(unit))
        else:
            words[-1] += piece
            word_tokens[-1].extend(unit)
    return words, word_tokens


def _token_probs(decoder: WhisperDecoder, hidden: torch.Tensor, tokens: list[int], vocab: int) -> list[float]:
    """``softmax(logits[i, :vocab])[tokens[i]]`` per row of ``hidden`` (L, D), projected a block of
    :data:`PROB_ROWS` rows at a time: a window's whole logits would be a (tokens, vocabulary) float32
    tensor, ~40 MB, and its softmax another."""
    out: list[float] = []
    for row in range(0, len(tokens), PROB_ROWS):
        chunk = torch.tensor(tokens[row:row + PROB_ROWS])
        logits = decoder.logits(hidden[row:row + PROB_ROWS])[:, :vocab].float()
        picked = logits[torch.arange(len(chunk)), chunk]
        out += torch.exp(picked - torch.logsumexp(logits, dim=-1)).tolist()
    return out


def _align(model: WhisperModel, tokenizer: Any, enc: torch.Tensor, text_tokens: list[int], sot_sequence: list[int],
           num_frames: int, language: str | None) -> list[dict]:
    gen = model.config.generation
    tokens = [*sot_sequence, gen.no_timestamps_id, *text_tokens, gen.eot_id]
    ids = torch.tensor([tokens], device=enc.device)
    probs, hidden = model.decoder.cross_attention(enc[None], ids, gen.alignment_heads, max_frames=num_frames // 2,
                                                  logits=False)
    start = len(sot_sequence)
    text_probs = _token_probs(model.decoder, hidden[0, start:start + len(text_tokens)], text_tokens, gen.eot_id)
    weights = probs[0].float()  # (heads, tokens, frames)
    std, mean = torch.std_mean(weights, dim=-2, keepdim=True, unbiased=False)
    weights = median_filter((weights - mean) / std, MEDIAN_FILTER_WIDTH)
    matrix = weights.mean(dim=0)[start:-1]
    text_index, time_index = dtw(-matrix.double().cpu().numpy())
    words, word_tokens = split_words(tokenizer, text_tokens + [gen.eot_id], gen.eot_id, language)
    if len(word_tokens) <= 1:
        return []
    boundaries = np.concatenate([[0], np.cumsum([len(t) for t in word_tokens[:-1]])])
    jumps = np.concatenate([[True], np.diff(text_index) != 0])
    jump_times = time_index[jumps] / round(1 / gen.time_precision)
    starts, ends = jump_times[boundaries[:-1]], jump_times[boundaries[1:]]
    return [
        {"word": w, "tokens": t, "start": float(s), "end": float(e), "probability": float(np.mean(text_probs[a:b]))}
        for w, t, s, e, a, b in zip(words, word_tokens, starts, ends, boundaries[:-1], boundaries[1:], strict=False)
    ]


def _merge_punctuation(alignment: list[dict], prepended: str, appended: str) -> None:
    i, j = len(alignment) - 2, len(alignment) - 1
    while i >= 0:
        before, after = alignment[i], alignment[j]
        if before["word"].startswith(" ") and before["word"].strip() in prepended:
            after["word"] = before["word"] + after["word"]
            after["tokens"] = before["tokens"] + after["tokens"]
            before["word"], before["tokens"] = "", []
        else:
            j = i
        i -= 1
    i, j = 0, 1
    while j < len(alignment):
        before, after = alignment[i], alignment[j]
        if not before["word"].endswith(" ") and after["word"] in appended:
            before["word"] = before["word"] + after["word"]
            before["tokens"] = before["tokens"] + after["tokens"]
            after["word"], after["tokens"] = "", []
        else:
            i = j
        j += 1


def add_word_timestamps(model: WhisperModel, tokenizer: Any, enc: torch.Tensor, segments: list[Segment], *,
                        sot_sequence: list[int], num_frames: int, time_offset: float, last_speech: float,
                        language: str | None) -> None:
    """Set ``words`` on the segments of one window (``enc``: its encoder output (S, D)).

    ``last_speech``: where speech last ended before this window (a first word after a pause is
    clipped against it)."""
    eot = model.config.generation.eot_id
    per_segment = [[t for t in seg.tokens if t < eot] for seg in segments]
    text_tokens = [t for tokens in per_segment for t in tokens]
    for seg in segments:
        seg.words = []
    if not text_tokens:
        return
    alignment = _align(model, tokenizer, enc, text_tokens, sot_sequence, num_frames, language)
    durations = np.array([w["end"] - w["start"] for w in alignment])
    durations = durations[durations.nonzero()]
    median = min(0.7, float(np.median(durations))) if len(durations) else 0.0
    longest = median * 2
    if len(durations):  # words at sentence boundaries are at most twice the median long
        for k in range(1, len(alignment)):
            if alignment[k]["end"] - alignment[k]["start"] > longest:
                if alignment[k]["word"] in SENTENCE_END:
                    alignment[k]["end"] = alignment[k]["start"] + longest
                elif alignment[k - 1]["word"] in SENTENCE_END:
                    alignment[k]["start"] = alignment[k]["end"] - longest
    _merge_punctuation(alignment, PREPEND_PUNCTUATION, APPEND_PUNCTUATION)
    index = 0
    for seg, tokens in zip(segments, per_segment, strict=False):
        used, words = 0, []
        while index < len(alignment) and used < len(tokens):
            timing = alignment[index]
            if timing["word"]:
                words.append(WordTiming(word=timing["word"], start=round(time_offset + timing["start"], 2),
                                        end=round(time_offset + timing["end"], 2), confidence=timing["probability"]))
            used += len(timing["tokens"])
            index += 1
        if words:
            _fit_segment(seg, words, median, longest, last_speech)
            last_speech = seg.end
        seg.words = words


def _fit_segment(seg: Segment, words: list[WordTiming], median: float, longest: float, last_speech: float) -> None:
    """openai-whisper's boundary clean-up: a long first word after a pause is clipped, and the
    segment's bounds follow its words unless a word overshoots the segment by more than 0.5 s."""
    first = words[0]
    if first.end - last_speech > median * 4 and (
            first.end - first.start > longest or (len(words) > 1 and words[1].end - first.start > longest * 2)):
        if len(words) > 1 and words[1].end - words[1].start > longest:
            boundary = max(words[1].end / 2, words[1].end - longest)
            first.end = words[1].start = boundary
        first.start = max(0.0, first.end - longest)
    if seg.start < first.end and seg.start - 0.5 > first.start:
        first.start = max(0.0, min(first.end - median, seg.start))
    else:
        seg.start = first.start
    last = words[-1]
    if seg.end > last.start and seg.end + 0.5 < last.end:
        last.end = max(last.start + median, seg.end)
    else:
        seg.end = last.end


def last_end(segments: list[Segment]) -> float | None:
    """Where the last word of ``segments`` ends (the last segment's end when no segment has words)."""
    ends = [w.end for seg in segments for w in (seg.words or ())]
    return ends[-1] if ends else (segments[-1].end if segments else None)


#: the punctuation openai-whisper leaves out of a segment's anomaly score (a word equal to a substring of it)
_ANOMALY_PUNCTUATION = "\"'“¿([{-\"'.。,，!！?？:：”)]}、"


def _word_anomaly(word: WordTiming) -> float:
    """How unlike speech a word is: improbable, very short or very long (openai-whisper's score)."""
    duration = word.end - word.start
    score = 1.0 if (word.confidence or 0.0) < 0.15 else 0.0
    if duration < 0.133:
        score += (0.133 - duration) * 15
    if duration > 2.0:
        score += duration - 2.0
    return score


def _is_anomaly(seg: Segment | None) -> bool:
    if seg is None or not seg.words:
        return False
    words = [w for w in seg.words if w.word not in _ANOMALY_PUNCTUATION][:8]
    score = sum(_word_anomaly(w) for w in words)
    return score >= 3 or score + 0.01 >= len(words)


def _next_with_words(segments: list[Segment]) -> Segment | None:
    return next((s for s in segments if s.words), None)


def skip_hallucinations(segments: list[Segment], *, threshold: float, seek: int, previous_seek: int, size: int,
                        single_ending: bool, last_speech: float, content_frames: int, frames_per_second: int,
                        window_frames: int) -> tuple[int, bool]:
    """openai-whisper's ``hallucination_silence_threshold`` for one word-timed window.

    Returns the next seek and whether the window's segments are kept; drops (in place) the segments
    from a likely hallucination surrounded by silence on.  ``seek``: the seek after the window.
    """
    time_offset = previous_seek / frames_per_second
    window_end = (previous_seek + window_frames) / frames_per_second
    duration = size / frames_per_second
    if not single_ending:
        end = last_end(segments)
        if end is not None and end > time_offset:
            seek = round(end * frames_per_second) if window_end - end > threshold else previous_seek + size
    first = _next_with_words(segments)
    if first is not None and _is_anomaly(first):
        gap = first.start - time_offset
        if gap > threshold:  # skip the silence before a first segment that may be a hallucination
            return previous_seek + round(gap * frames_per_second), False
    previous_end = last_speech
    for i, seg in enumerate(segments):
        if not seg.words:
            continue
        if _is_anomaly(seg):
            following = _next_with_words(segments[i + 1:])
            next_start = following.words[0].start if following is not None else time_offset + duration
            silence_before = seg.start - previous_end > threshold or seg.start < threshold or \
                seg.start - time_offset < 2.0
            silence_after = next_start - seg.end > threshold or _is_anomaly(following) or window_end - seg.end < 2.0
            if silence_before and silence_after:
                seek = round(max(time_offset + 1, seg.start) * frames_per_second)
                if content_frames / frames_per_second - seg.end < threshold:
                    seek = content_frames
                del segments[i:]
                break
        previous_end = seg.end
    return seek, True
