"""CTC search: greedy and prefix beam search, batched, recording where each token was emitted.

``ctc_greedy_search(log_probs, lengths, blank)``
    argmax per frame, repeats merged, blanks removed.  ``token_frames`` is the first frame of each
    token's run, ``token_confidences`` the highest posterior over the run, ``score`` the log
    probability of the argmax path.

``ctc_prefix_beam_search(log_probs, lengths, beam_size, n_best, blank, blank_skip_threshold, context)``
    WeNet's CTC prefix beam search (``wenet/transformer/search.py``), result for result: per frame the
    ``beam_size`` most likely labels (ties: lower id first), each prefix's blank- and
    non-blank-ending probabilities merged by log-add, the ``beam_size`` best prefixes kept (a stable
    sort: ties keep the order prefixes were first reached).  ``score`` is the log probability of the
    label sequence summed over the alignments the beam kept (plus the hotword bonus with a
    ``context``).  ``token_frames`` are the frames WeNet records as "times": along the prefix's
    best (Viterbi) alignment, the frame where each token was emitted — moved forward while the
    token repeats and the repetition improves the path.  ``token_confidences`` are the token's
    posteriors at those frames.

    Prefixes with probability zero (a repeat with no blank between, in too few frames) can fill a
    beam wider than the possibilities, as in WeNet; they are left out of the results.

    ``blank_skip_threshold``: a frame whose blank posterior is at least this takes the blank
    transition only (the other labels are pruned there); scores then sum over the alignments that
    are blank on those frames.  ``context``: a :class:`~oasr.decoding.context.ContextGraph`; prefixes
    are ranked by score plus bonus, the bonus is finalized at the end and the n-best re-sorted.

:class:`CtcPrefixBeamState` runs the same search one chunk of frames at a time for a stream; its
results after the last chunk equal the offline search over the concatenated log-probs.

Log-probs are float32 (other dtypes are converted) and must not be NaN; -inf is fine.

When ``oasr-kernels`` is installed, its numba kernels (slots ``ctc_prefix_beam_search`` and
``ctc_prefix_beam_state``) run the prefix beam search with identical results; ``OASR_KERNELS=0``
forces this module's reference code.  Log-probs on a CUDA device go to the slots' ``@cuda`` variants
(searched on the device) when registered, else to the host.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from oasr.decoding.context import ROOT, ContextGraph
from oasr.decoding.types import Hypothesis
from oasr.errors import ConfigError
from oasr.layers._backend import kernel

NEG_INF = float("-inf")


def log_add(a: float, b: float) -> float:
    """log(exp(a) + exp(b)), computed as WeNet does (the scores match it bit for bit).

    With one side -inf WeNet's formula returns the other side exactly, so that case skips it."""
    if a == NEG_INF:
        return b
    if b == NEG_INF:
        return a
    m = a if a >= b else b
    return m + math.log(math.exp(a - m) + math.exp(b - m))


# -- greedy -------------------------------------------------------------------------------------------
def ctc_greedy_search(log_probs: torch.Tensor, lengths: torch.Tensor | Sequence[int], blank: int = 0) -> list[Hypothesis]:
    """Best path per row of ``log_probs`` (B, T, V), frames past ``lengths`` ignored."""
    fast = _device_kernel("ctc_greedy_search", log_probs)
    if fast is not None:
        return fast(log_probs, lengths, blank)
    log_probs, lengths = _check_batch(log_probs, lengths, blank)
    best, ids = log_probs.max(dim=-1)
    best = best.double().numpy()
    ids = ids.numpy()
    results = []
    for row in range(log_probs.shape[0]):
        n = int(lengths[row])
        path, path_lp = ids[row, :n], best[row, :n]
        if n == 0:
            results.append(Hypothesis(tokens=[], score=0.0, token_frames=[], token_confidences=[]))
            continue
        starts = np.flatnonzero(np.concatenate(([True], path[1:] != path[:-1])))
        run_max = np.maximum.reduceat(path_lp, starts)
        keep = path[starts] != blank
        results.append(Hypothesis(
            tokens=path[starts][keep].tolist(),
            score=float(path_lp.sum()),
            token_frames=starts[keep].tolist(),
            token_confidences=np.exp(run_max[keep]).tolist(),
        ))
    return results


# -- prefix beam search -------------------------------------------------------------------------------
def ctc_prefix_beam_search(
    log_probs: torch.Tensor,
    lengths: torch.Tensor | Sequence[int],
    beam_size: int = 10,
    n_best: int | None = None,
    blank: int = 0,
    blank_skip_threshold: float | None = None,
    context: ContextGraph | None = None,
) -> list[list[Hypothesis]]:
    """The ``n_best`` (default: ``beam_size``) best label sequences of each row, best first."""
    fast = _device_kernel("ctc_prefix_beam_search", log_probs)
    if fast is not None:
        return fast(log_probs, lengths, beam_size=beam_size, n_best=n_best, blank=blank,
                    blank_skip_threshold=blank_skip_threshold, context=context)
    log_probs, lengths = _check_batch(log_probs, lengths, blank)
    _check_search(beam_size, n_best, blank_skip_threshold)
    fast = kernel("ctc_prefix_beam_search")
    if fast is not None:
        return fast(log_probs, lengths, beam_size=beam_size, n_best=n_best, blank=blank,
                    blank_skip_threshold=blank_skip_threshold, context=context)
    results = []
    for row in range(log_probs.shape[0]):
        search = ReferencePrefixBeam(beam_size, blank, skip_log_threshold(blank_skip_threshold), context)
        search.advance(log_probs[row, :int(lengths[row])])
        results.append(hypotheses(search.nbest(n_best or beam_size)))
    return results


class CtcPrefixBeamState:
    """Prefix beam search over a stream, advanced one chunk of log-probs (T, V) at a time."""

    def __init__(self, beam_size: int = 10, blank: int = 0, blank_skip_threshold: float | None = None,
                 context: ContextGraph | None = None):
        _check_search(beam_size, None, blank_skip_threshold)
        self.beam_size = beam_size
        self.blank = blank
        impl = kernel("ctc_prefix_beam_state")
        factory = impl if impl is not None else ReferencePrefixBeam
        self._search = factory(beam_size, blank, skip_log_threshold(blank_skip_threshold), context)

    @property
    def frames(self) -> int:
        """Frames consumed so far."""
        return self._search.frames

    def advance(self, log_probs: torch.Tensor | np.ndarray) -> None:
        if isinstance(log_probs, np.ndarray):
            log_probs = torch.from_numpy(log_probs)
        if log_probs.dim() != 2:
            raise ConfigError(f"CTC log-probs of a stream chunk must be (T, V), got shape {tuple(log_probs.shape)}",
                              key="log_probs")
        if log_probs.shape[0] and not 0 <= self.blank < log_probs.shape[1]:
            raise ConfigError(f"blank id {self.blank} is outside the vocabulary of {log_probs.shape[1]}", key="blank")
        self._search.advance(log_probs.detach().float().cpu())

    def results(self, n_best: int | None = None) -> list[Hypothesis]:
        """The current n-best (finalized for hotwords, the state itself is not changed)."""
        return hypotheses(self._search.nbest(n_best or self.beam_size))


def hypotheses(nbest: list[tuple[list[int], float, list[int], list[float]]]) -> list[Hypothesis]:
    """Hypotheses from a search's (tokens, score, frames, token log-probs) tuples."""
    return [Hypothesis(tokens=list(tokens), score=score, token_frames=list(frames),
                       token_confidences=np.exp(np.asarray(token_lps, dtype=np.float64)).tolist())
            for tokens, score, frames, token_lps in nbest]


def skip_log_threshold(blank_skip_threshold: float | None) -> float | None:
    """The blank log-probability at or above which a frame is skipped (None: never)."""
    if blank_skip_threshold is None:
        return None
    return math.log(blank_skip_threshold) if blank_skip_threshold > 0 else NEG_INF


def topk_labels(log_probs: torch.Tensor, k: int) -> tuple[list[list[float]], list[list[int]]]:
    """Per frame the ``k`` largest log-probs and their ids, largest first, ties by lower id.

    (``torch.topk`` leaves the order of equal values unspecified; this fixes it.)
    """
    values, ids = torch.topk(log_probs, k, dim=-1)
    order = torch.argsort(ids, dim=-1, stable=True)
    values, ids = values.gather(-1, order), ids.gather(-1, order)
    order = torch.argsort(values, dim=-1, descending=True, stable=True)
    values, ids = values.gather(-1, order), ids.gather(-1, order)
    # an equal value left out of the top k with a lower id than one taken in: sort that frame fully
    ties = (log_probs >= values[:, -1:]).sum(-1) > k
    for t in torch.nonzero(ties).flatten().tolist():
        full_values, full_ids = torch.sort(log_probs[t], descending=True, stable=True)
        values[t], ids[t] = full_values[:k], full_ids[:k]
    return values.tolist(), ids.tolist()


class _Prefix:
    """One prefix at one frame: WeNet's PrefixScore.  ``times_*`` are tuples of (frame, log-prob)."""

    __slots__ = ("blank", "nonblank", "v_blank", "v_nonblank", "peak", "times_blank", "times_nonblank",
                 "context_state", "context_score")

    def __init__(self, context_state: int, context_score: float):
        self.blank = NEG_INF
        self.nonblank = NEG_INF
        self.v_blank = NEG_INF
        self.v_nonblank = NEG_INF
        self.peak = NEG_INF
        self.times_blank: tuple = ()
        self.times_nonblank: tuple = ()
        self.context_state = context_state
        self.context_score = context_score

    def score(self) -> float:
        return log_add(self.blank, self.nonblank)

    def viterbi(self) -> float:
        return self.v_blank if self.v_blank > self.v_nonblank else self.v_nonblank

    def times(self) -> tuple:
        return self.times_blank if self.v_blank > self.v_nonblank else self.times_nonblank


class ReferencePrefixBeam:
    """The reference prefix beam search over one stream (pure Python, float64 scores)."""

    def __init__(self, beam_size: int, blank: int, skip_log: float | None = None, context: ContextGraph | None = None):
        self.beam_size = beam_size
        self.blank = blank
        self.skip_log = skip_log
        self.context = context
        start = _Prefix(ROOT, 0.0)
        start.blank, start.v_blank, start.v_nonblank = 0.0, 0.0, 0.0
        self.beams: list[tuple[tuple[int, ...], _Prefix]] = [((), start)]
        self.frames = 0

    def advance(self, log_probs: torch.Tensor) -> None:
        if log_probs.shape[0] == 0:
            return
        values, ids = topk_labels(log_probs, min(self.beam_size, log_probs.shape[1]))
        blank_lps = log_probs[:, self.blank].tolist()
        for t in range(log_probs.shape[0]):
            if self.skip_log is not None and blank_lps[t] >= self.skip_log:
                self._step(self.frames, [(self.blank, blank_lps[t])])
            else:
                self._step(self.frames, list(zip(ids[t], values[t], strict=True)))
            self.frames += 1

    def _extension(self, table: dict, prefix: tuple, parent: _Prefix, token: int) -> _Prefix:
        entry = table.get(prefix)
        if entry is None:
            if self.context is None:
                entry = _Prefix(parent.context_state, parent.context_score)
            else:
                delta, state = self.context.step(parent.context_state, token)
                entry = _Prefix(state, parent.context_score + delta)
            table[prefix] = entry
        return entry

    def _same(self, table: dict, prefix: tuple, parent: _Prefix) -> _Prefix:
        entry = table.get(prefix)
        if entry is None:
            entry = table[prefix] = _Prefix(parent.context_state, parent.context_score)
        return entry

    def _step(self, t: int, labels: list[tuple[int, float]]) -> None:
        blank = self.blank
        table: dict[tuple[int, ...], _Prefix] = {}
        beams = [(prefix, h, h.score(), h.viterbi(), h.times()) for prefix, h in self.beams]
        for token, lp in labels:
            for prefix, h, h_score, h_viterbi, h_times in beams:
                if token == blank:
                    entry = self._same(table, prefix, h)
                    entry.blank = log_add(entry.blank, h_score + lp)
                    entry.v_blank = h_viterbi + lp
                    entry.times_blank = h_times
                elif prefix and token == prefix[-1]:
                    # the token repeats without a blank between: the prefix stays
                    entry = self._same(table, prefix, h)
                    entry.nonblank = log_add(entry.nonblank, h.nonblank + lp)
                    if entry.v_nonblank < h.v_nonblank + lp:
                        entry.v_nonblank = h.v_nonblank + lp
                        if entry.peak < lp:
                            entry.peak = lp
                            entry.times_nonblank = h.times_nonblank[:-1] + ((t, lp),)
                    # after a blank, the same token is a new one
                    entry = self._extension(table, prefix + (token,), h, token)
                    entry.nonblank = log_add(entry.nonblank, h.blank + lp)
                    if entry.v_nonblank < h.v_blank + lp:
                        entry.v_nonblank = h.v_blank + lp
                        entry.peak = lp
                        entry.times_nonblank = h.times_blank + ((t, lp),)
                else:
                    entry = self._extension(table, prefix + (token,), h, token)
                    entry.nonblank = log_add(entry.nonblank, h_score + lp)
                    if entry.v_nonblank < h_viterbi + lp:
                        entry.v_nonblank = h_viterbi + lp
                        entry.peak = lp
                        entry.times_nonblank = h_times + ((t, lp),)
        ranked = sorted(table.items(), key=lambda item: item[1].score() + item[1].context_score, reverse=True)
        self.beams = ranked[:self.beam_size]

    def nbest(self, n: int) -> list[tuple[list[int], float, list[int], list[float]]]:
        out = []
        for prefix, h in self.beams:
            if h.score() == NEG_INF:
                continue  # reached only through impossible alignments (kept in the beam as WeNet does)
            score = h.score() + h.context_score
            if self.context is not None:
                score += self.context.finalize(h.context_state)
            times = h.times()
            out.append((list(prefix), score, [f for f, _ in times], [lp for _, lp in times]))
        if self.context is not None:
            out.sort(key=lambda r: r[1], reverse=True)
        return out[:n]


# -- argument checks ----------------------------------------------------------------------------------
def _device_kernel(name: str, log_probs: Any):
    """The device variant of kernel slot ``name`` for log-probs that live on an accelerator, or None."""
    if isinstance(log_probs, torch.Tensor) and log_probs.device.type != "cpu":
        return kernel(name, log_probs.device)
    return None


def _check_batch(log_probs: Any, lengths: Any, blank: int) -> tuple[torch.Tensor, np.ndarray]:
    if isinstance(log_probs, np.ndarray):
        log_probs = torch.from_numpy(log_probs)
    if not isinstance(log_probs, torch.Tensor) or log_probs.dim() != 3:
        raise ConfigError(f"CTC log-probs must be a (B, T, V) tensor, got {getattr(log_probs, 'shape', type(log_probs))}",
                          key="log_probs")
    log_probs = log_probs.detach().float().cpu()
    batch, frames, vocab = log_probs.shape
    lengths = np.asarray(lengths.cpu() if isinstance(lengths, torch.Tensor) else lengths, dtype=np.int64).reshape(-1)
    if lengths.shape[0] != batch:
        raise ConfigError(f"{lengths.shape[0]} lengths for a batch of {batch} rows", key="lengths")
    if batch and (lengths.min() < 0 or lengths.max() > frames):
        raise ConfigError(f"lengths must lie in [0, {frames}] (the frame axis), got {lengths.tolist()}", key="lengths")
    if not 0 <= blank < vocab:
        raise ConfigError(f"blank id {blank} is outside the vocabulary of {vocab}", key="blank")
    return log_probs, lengths


def _check_search(beam_size: int, n_best: int | None, blank_skip_threshold: float | None) -> None:
    if int(beam_size) < 1:
        raise ConfigError(f"beam_size must be at least 1, got {beam_size}", key="beam_size")
    if n_best is not None and int(n_best) < 1:
        raise ConfigError(f"n_best must be at least 1, got {n_best}", key="n_best")
    if blank_skip_threshold is not None and not 0.0 <= blank_skip_threshold <= 1.0:
        raise ConfigError(f"blank_skip_threshold is a probability in [0, 1], got {blank_skip_threshold}",
                          key="blank_skip_threshold")
