"""Numba CPU kernels for CTC prefix beam search (kernel slots ``ctc_prefix_beam_search`` and
``ctc_prefix_beam_state``).

Same results as :mod:`oasr.decoding.ctc`'s reference search (tokens, float64 scores, frames), much
faster: prefixes live in a trie found through a hash table keyed by (parent, token), so a prefix is
one integer; the emission times of a prefix's Viterbi alignment are persistent linked lists shared
between prefixes; candidate prefixes become trie nodes only if they survive pruning.  Per frame the
work is a top-k search of the vocabulary (which skips blocks of ids whose maximum is too small) and
``beam × k`` constant-time updates.  The steps themselves are in :mod:`oasr_kernels._prefix_beam`.

A stream's arrays grow with it; before they would overflow, nodes the beam can no longer reach are
dropped, so a long stream stays bounded by what the beam can reach.
"""

from __future__ import annotations

import numpy as np
import torch

from oasr.decoding.ctc import hypotheses, skip_log_threshold
from oasr_kernels import _prefix_beam as pb

# frames advanced per call: bounds the new nodes one call can create before the next compaction
_CHUNK_FRAMES = 256
_NO_CONTEXT = (np.zeros(2, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(1, np.int64),
               np.zeros(1, np.float64), np.zeros(1, np.float64))


def _grow(array: np.ndarray, rows: int) -> np.ndarray:
    out = np.zeros((rows, *array.shape[1:]), dtype=array.dtype)
    out[:array.shape[0]] = array
    return out


class PrefixBeamState:
    """One stream's prefix beam search: the interface of :class:`oasr.decoding.ctc.ReferencePrefixBeam`
    (``advance(log_probs)``, ``nbest(n)``, ``frames``)."""

    def __init__(self, beam_size: int, blank: int, skip_log: float | None = None, context=None):
        self.beam_size = int(beam_size)
        self.blank = int(blank)
        self.skip_log = np.inf if skip_log is None else float(skip_log)
        self.context = context
        if context is None:
            self._ctx = _NO_CONTEXT
        else:
            a = context.arrays()
            self._ctx = (a["child_start"], a["child_token"], a["child_state"], a["fail"], a["node_score"],
                         a["output_score"])
        self.vocab = 0
        self.counts = np.array([1, 0, 1, 0], np.int64)
        self.ti = np.zeros((1024, 4), np.int64)
        self.tf = np.zeros(1024, np.float64)
        self.ti[0] = (-1, -1, 0, 0)
        self.li = np.zeros((1024, 2), np.int64)
        self.lf = np.zeros(1024, np.float64)
        self.h_keys = np.full(2048, -1, np.int64)
        self.h_vals = np.zeros(2048, np.int64)
        self.bi = np.full((self.beam_size, 3), -1, np.int64)
        self.bf = np.full((self.beam_size, 5), -np.inf)
        # the start: the empty prefix, blank-ending with probability one
        self.bi[0, pb.B_NODE] = 0
        self.bf[0] = (0.0, 0.0, -np.inf, 0.0, 0.0)

    @property
    def frames(self) -> int:
        return int(self.counts[3])

    def _reserve(self, frames: int) -> None:
        # each frame adds at most one trie node and one time node per surviving prefix
        new = frames * self.beam_size
        if self.counts[0] + new > self.ti.shape[0] or self.counts[1] + new > self.li.shape[0] \
                or 2 * (self.counts[0] + new) > self.h_keys.shape[0]:
            pb.compact(self.counts, self.vocab, self.ti, self.tf, self.h_keys, self.h_vals, self.li, self.lf, self.bi)
        if self.counts[0] + new > self.ti.shape[0]:
            rows = max(int(self.counts[0] + new), 2 * self.ti.shape[0])
            self.ti, self.tf = _grow(self.ti, rows), _grow(self.tf, rows)
        if self.counts[1] + new > self.li.shape[0]:
            rows = max(int(self.counts[1] + new), 2 * self.li.shape[0])
            self.li, self.lf = _grow(self.li, rows), _grow(self.lf, rows)
        if 2 * (self.counts[0] + new) > self.h_keys.shape[0]:
            size = self.h_keys.shape[0]
            while size < 2 * (self.counts[0] + new):
                size *= 2
            self.h_keys = np.full(size, -1, np.int64)
            self.h_vals = np.zeros(size, np.int64)
            # compaction rebuilds the table (everything left is reachable, so nothing else changes)
            pb.compact(self.counts, self.vocab, self.ti, self.tf, self.h_keys, self.h_vals, self.li, self.lf, self.bi)

    def advance(self, log_probs) -> None:
        lp = log_probs.numpy() if isinstance(log_probs, torch.Tensor) else np.asarray(log_probs)
        lp = np.ascontiguousarray(lp, dtype=np.float32)
        frames, vocab = lp.shape
        if frames == 0:
            return
        if self.vocab == 0:
            self.vocab = vocab
        elif vocab != self.vocab:
            raise ValueError(f"a stream's log-probs changed vocabulary size from {self.vocab} to {vocab}")
        k = min(self.beam_size, vocab)
        blocks = vocab // pb.BLOCK
        for start in range(0, frames, _CHUNK_FRAMES):
            chunk = lp[start:start + _CHUNK_FRAMES]
            self._reserve(chunk.shape[0])
            if blocks > k:  # block maxima for the top-k search, one vectorized pass
                block_max = torch.from_numpy(chunk)[:, :blocks * pb.BLOCK].view(chunk.shape[0], blocks, pb.BLOCK)
                block_max = block_max.amax(-1).numpy()
            else:
                block_max = np.empty((chunk.shape[0], 0), np.float32)
            pb.advance(chunk, block_max, k, self.beam_size, self.blank, self.skip_log, self.vocab, self.counts,
                       self.ti, self.tf, self.h_keys, self.h_vals, self.li, self.lf, self.bi, self.bf,
                       self.context is not None, self._ctx)

    def nbest(self, n: int) -> list[tuple[list[int], float, list[int], list[float]]]:
        out = []
        for j in range(int(self.counts[2])):
            acoustic = float(self.bf[j, pb.S_TOTAL])
            if acoustic == -np.inf:
                continue  # reached only through impossible alignments
            node = int(self.bi[j, pb.B_NODE])
            score = acoustic + self.tf[node]
            if self.context is not None:
                score += self.context.finalize(int(self.ti[node, pb.T_CTX]))
            length = int(self.ti[node, pb.T_LEN])
            blank_path = self.bf[j, pb.S_VBLANK] > self.bf[j, pb.S_VNONBLANK]
            times = self.bi[j, pb.B_TIMES_BLANK if blank_path else pb.B_TIMES]
            tokens, frames, lps = np.empty(length, np.int64), np.empty(length, np.int64), np.empty(length)
            pb.backtrack(node, times, self.ti, self.li, self.lf, tokens, frames, lps)
            out.append((tokens.tolist(), float(score), frames.tolist(), lps.tolist()))
        if self.context is not None:
            out.sort(key=lambda r: r[1], reverse=True)
        return out[:n]


def ctc_prefix_beam_search(log_probs, lengths, beam_size=10, n_best=None, blank=0, blank_skip_threshold=None,
                           context=None):
    """:func:`oasr.decoding.ctc.ctc_prefix_beam_search`'s signature and results (its arguments are
    checked there)."""
    lp = log_probs.numpy() if isinstance(log_probs, torch.Tensor) else np.asarray(log_probs, np.float32)
    skip_log = skip_log_threshold(blank_skip_threshold)
    results = []
    for row in range(lp.shape[0]):
        state = PrefixBeamState(beam_size, blank, skip_log, context)
        state.advance(lp[row, :int(lengths[row])])
        results.append(hypotheses(state.nbest(n_best or beam_size)))
    return results
