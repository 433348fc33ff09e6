"""Word timings and confidences from token emission frames.

Conventions (frame ``f`` covers ``[f × shift, (f + 1) × shift)`` seconds after ``offset_seconds``):

- The words are the decoded text split at whitespace, with every CJK ideograph or kana its own word
  (punctuation right after one joins it: ``好，``).  Each word is a literal substring of
  ``tokenizer.decode(tokens)``; the tokens of a word are those whose text (``token_pieces``) falls in
  it, plus tokens right before them that contributed no text yet (the first bytes of a character).
- ``start`` = first frame of the word's first token × shift; ``end`` = (the exclusive end frame of its
  last token, i.e. last emitting frame + 1) × shift.  Without explicit end frames a token is taken to
  span one frame, so ``end`` = (emission frame of the last token + 1) × shift.  Both plus
  ``offset_seconds``; not rounded.
- ``confidence`` = the mean (``aggregate="mean"``, default) or minimum (``"min"``) of the word's token
  confidences; ``None`` without token confidences.  A token's confidence from CTC posteriors is the
  highest posterior of that token over the frames it spans (:func:`ctc_token_confidences`).
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Sequence
from typing import Any

import torch

from oasr.decoding.types import WordTiming
from oasr.errors import ConfigError

__all__ = ["WordTiming", "ctc_alignment_spans", "ctc_token_confidences", "finish_frame_hypothesis", "is_cjk", "split_words",
           "words_from_tokens"]


def is_cjk(ch: str) -> bool:
    """Characters written without spaces between words: CJK ideographs, Hiragana, Katakana."""
    cp = ord(ch)
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0xF900 <= cp <= 0xFAFF or 0x20000 <= cp <= 0x2FFFF
            or 0x3040 <= cp <= 0x30FF or 0x31F0 <= cp <= 0x31FF)


def split_words(text: str) -> list[tuple[int, int]]:
    """``[start, end)`` character spans of the words of ``text`` (see the module docstring)."""
    spans: list[tuple[int, int]] = []
    start = None
    cjk_word = False
    for i, ch in enumerate(text):
        if ch.isspace():
            if start is not None:
                spans.append((start, i))
                start = None
        elif is_cjk(ch):
            if start is not None:
                spans.append((start, i))
            start, cjk_word = i, True
        elif start is not None and cjk_word and unicodedata.category(ch).startswith("P"):
            continue
        else:
            if start is not None and cjk_word:
                spans.append((start, i))
                start = None
            if start is None:
                start, cjk_word = i, False
    if start is not None:
        spans.append((start, len(text)))
    return spans


def words_from_tokens(
    tokens: Sequence[int],
    token_frames: Sequence[int],
    confidences: Sequence[float] | None,
    tokenizer: Any,
    frame_shift_seconds: float,
    *,
    token_end_frames: Sequence[int] | None = None,
    offset_seconds: float = 0.0,
    aggregate: str = "mean",
) -> list[WordTiming]:
    """The words of ``tokenizer.decode(tokens)`` with times and confidences (module docstring)."""
    n = len(tokens)
    if len(token_frames) != n or (confidences is not None and len(confidences) != n) or (
            token_end_frames is not None and len(token_end_frames) != n):
        raise ConfigError(
            f"words_from_tokens needs one frame (and confidence, end frame) per token: {n} tokens, "
            f"{len(token_frames)} frames, {None if confidences is None else len(confidences)} confidences, "
            f"{None if token_end_frames is None else len(token_end_frames)} end frames", key="token_frames")
    if aggregate not in ("mean", "min"):
        raise ConfigError(f"aggregate must be 'mean' or 'min', got {aggregate!r}", key="aggregate")
    pieces = tokenizer.token_pieces(list(tokens))
    owner: list[int] = []
    for index, piece in enumerate(pieces):
        owner.extend([index] * len(piece))
    text = "".join(pieces)
    specials = tokenizer.special_ids
    words = []
    for start, end in split_words(text):
        first, last = owner[start], owner[end - 1]
        while first > 0 and pieces[first - 1] == "" and int(tokens[first - 1]) not in specials:
            first -= 1
        end_frame = token_end_frames[last] if token_end_frames is not None else token_frames[last] + 1
        confidence = None
        if confidences is not None:
            span = [float(c) for c in confidences[first:last + 1]]
            confidence = min(span) if aggregate == "min" else math.fsum(span) / len(span)
        words.append(WordTiming(
            word=text[start:end],
            start=token_frames[first] * frame_shift_seconds + offset_seconds,
            end=end_frame * frame_shift_seconds + offset_seconds,
            confidence=confidence,
        ))
    return words


def ctc_alignment_spans(alignment: Sequence[int], blank: int = 0) -> tuple[list[int], list[int], list[int]]:
    """(tokens, first frames, exclusive end frames) of the tokens a frame-level CTC path emits."""
    tokens: list[int] = []
    starts: list[int] = []
    ends: list[int] = []
    previous = None
    for frame, label in enumerate(int(x) for x in alignment):
        if label != previous and label != blank:
            tokens.append(label)
            starts.append(frame)
            ends.append(frame + 1)
        elif label == previous and label != blank:
            ends[-1] = frame + 1
        previous = label
    return tokens, starts, ends


def ctc_token_confidences(log_probs: torch.Tensor, tokens: Sequence[int], token_frames: Sequence[int],
                          token_end_frames: Sequence[int] | None = None) -> list[float]:
    """Each token's highest posterior over its frames ``[start, end)`` (end defaults to start + 1)
    from CTC log-probs (T, V)."""
    if log_probs.dim() != 2:
        raise ConfigError(f"log-probs must be (T, V), got shape {tuple(log_probs.shape)}", key="log_probs")
    out = []
    for i, (token, start) in enumerate(zip(tokens, token_frames, strict=True)):
        end = token_end_frames[i] if token_end_frames is not None else start + 1
        if not 0 <= start < end <= log_probs.shape[0]:
            raise ConfigError(f"token {i} spans frames [{start}, {end}) outside the {log_probs.shape[0]} frames",
                              key="token_frames")
        out.append(math.exp(float(log_probs[start:end, int(token)].max())))
    return out


def finish_frame_hypothesis(hyp: Any, frame_seconds: float, tokenizer: Any, *, word_timestamps: bool) -> None:
    """Complete a frame-synchronous search's :class:`~oasr.decoding.types.Hypothesis` (and its n-best):
    token start times from ``token_frames``, the utterance confidence as the geometric mean of the
    token confidences, and, when asked, word timings of the best one."""
    for h in [hyp, *(hyp.nbest or [])]:
        if h.token_frames is not None:
            h.token_times = [round(f * frame_seconds, 3) for f in h.token_frames]
        if h.token_confidences:
            conf = 1.0
            for c in h.token_confidences:
                conf *= c
            h.confidence = conf ** (1.0 / len(h.token_confidences))
    if word_timestamps and hyp.token_frames is not None:
        hyp.words = words_from_tokens(hyp.tokens, hyp.token_frames, hyp.token_confidences, tokenizer,
                                      frame_shift_seconds=frame_seconds)
