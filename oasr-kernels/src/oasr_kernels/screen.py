"""Numba CPU kernels of the int8 vocabulary screen: one row's resolve step (kernel slot ``screen_resolve_row``) and
the one pass that builds its int8 table and bound terms (slot ``screen_table_terms``, :func:`screen_table_terms`).

``oasr_models_hf.whisper.screen.VocabScreen.resolve`` makes a screened row's logits exact wherever a greedy decision
can depend on them: every id from ``cut`` (end-of-text) on, and every text logit whose upper bound reaches the
least lower bound of the row's best text logit.  In torch that is a dozen passes over the 51,864 logits (where,
max, two comparisons, any, nonzero, gathers, a GEMM over the gathered rows), each a dispatch and a fresh tensor:
~0.9 ms of a one-row step on tiny.en.  This kernel does the same in two passes over the row, with the dot products
of the recomputed rows read from the fp32 table in place.

The candidates and the values written are the torch path's: the coarse filter (the row's widest radius), then,
past 64 candidates, each candidate's own radius; more than ``max_exact`` candidates returns False (the caller takes
the full product).  The dot products sum in another order than MKL's (a few ulps, as any two GEMM shapes differ).
"""

from __future__ import annotations

import math

import numba
import numpy as np
import torch

_FAST = {"reassoc", "contract", "nsz", "arcp"}  # no nnan / ninf: the masks are -inf and stay meaningful
#: past this many coarse candidates each one's own radius is checked (as the torch path does)
_FINE_FROM = 64


@numba.njit(cache=True, fastmath=_FAST, boundscheck=False, nogil=True)
def _dot(table, r, h):  # pragma: no cover - compiled
    acc = np.float32(0.0)
    for i in range(h.shape[0]):
        acc += table[r, i] * h[i]
    return acc


@numba.njit(cache=True, fastmath=_FAST, boundscheck=False, nogil=True)
def _resolve_row(logits, h, table, w_norm, w_err, half, h_norm, w_norm_max, w_err_max, cut, max_exact,
                 cols):  # pragma: no cover - compiled
    for r in range(cut, table.shape[0]):  # the specials and timestamps: exact wherever not masked
        if not math.isinf(logits[r]):
            logits[r] = _dot(table, r, h)
    best, where = np.float32(-np.inf), 0
    for c in range(cut):  # the first largest text logit (torch's max)
        if logits[c] > best:
            best, where = logits[c], c
    threshold = np.float32(best - (half * w_norm[where] + h_norm * w_err[where]))
    if math.isinf(threshold):  # every text logit masked: none can win
        threshold = np.float32(np.inf)
    low = np.float32(threshold - (half * w_norm_max + h_norm * w_err_max))
    n = 0
    for c in range(cut):
        if logits[c] >= low:
            cols[n] = c
            n += 1
    if n > _FINE_FROM:
        kept = 0
        for j in range(n):
            c = cols[j]
            if logits[c] + (half * w_norm[c] + h_norm * w_err[c]) >= threshold:
                cols[kept] = c
                kept += 1
        n = kept
    if n > max_exact:
        return False
    for j in range(n):
        logits[cols[j]] = _dot(table, cols[j], h)
    return True


def screen_resolve_row(logits: torch.Tensor, hidden: torch.Tensor, table: torch.Tensor, w_norm: torch.Tensor,
                       w_err: torch.Tensor, half_step: float, h_norm: float, w_norm_max: float, w_err_max: float,
                       cut: int, max_exact: int, cols: np.ndarray) -> bool:
    """Resolve one screened row in place: ``logits`` (V,) float32 (the rules' masks applied), ``hidden`` (D,) and
    ``table`` (V, D) float32, ``w_norm`` / ``w_err`` (cut,) the text rows' bound terms, ``half_step`` / ``h_norm``
    the row's; ``cols``: an int64 scratch array of at least ``cut`` entries.  Contiguous CPU tensors.  Returns False
    (the row partly updated) when more than ``max_exact`` text rows would need recomputing."""
    f32 = np.float32
    return bool(_resolve_row(logits.numpy(), hidden.numpy(), table.numpy(), w_norm.numpy(), w_err.numpy(),
                             f32(half_step), f32(h_norm), f32(w_norm_max), f32(w_err_max), cut, max_exact, cols))




@numba.njit(cache=True, boundscheck=False, nogil=True)  # no fastmath: the division and rounding are torch's
def _table_terms(table, exact_from, slack, q, scale, w_norm, w_err):  # pragma: no cover - compiled
    rows, dim = table.shape
    unit = 2.0 ** -24
    for r in range(rows):
        amax = np.float32(0.0)
        for i in range(dim):
            amax = max(amax, abs(table[r, i]))
        s = amax / np.float32(127.0) if amax > 0 else np.float32(1.0)
        scale[r] = s
        norm, err, top = 0.0, 0.0, 0.0
        for i in range(dim):
            w = table[r, i]
            v = min(max(np.rint(w / s), np.float32(-127.0)), np.float32(127.0))
            q[r, i] = np.int8(v)
            if r < exact_from:
                w64, dq = np.float64(w), np.float64(v) * np.float64(s)
                norm += abs(w64)
                err = max(err, abs(w64 - dq))
                top = max(top, abs(w64), abs(dq))
        if r < exact_from:
            w_norm[r] = np.float32(norm * slack)
            w_err[r] = np.float32((err + (dim + 8) * unit * top) * slack)


def screen_table_terms(table: torch.Tensor, exact_from: int, slack: float
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One pass over a (V, D) float32 table: its per-row symmetric int8 copy ``q`` (V, D) and ``scale`` (V,) (as
    ``torch.round(w / scale)`` clamped to +-127, scale = row amax / 127 or 1), and for the text rows (``< exact_from``)
    the screen's bound terms in float64: ``w_norm`` = ||W_r||_1 and ``w_err`` = max|W_r - W^_r| plus the float terms
    ``(D + 8) u max(|W_r|, |W^_r|)``, each times ``slack``, as float32.  A contiguous CPU table."""
    rows, dim = table.shape
    q = torch.empty((rows, dim), dtype=torch.int8)
    scale = torch.empty(rows, dtype=torch.float32)
    w_norm = torch.empty(exact_from, dtype=torch.float32)
    w_err = torch.empty(exact_from, dtype=torch.float32)
    _table_terms(table.numpy(), exact_from, slack, q.numpy(), scale.numpy(), w_norm.numpy(), w_err.numpy())
    return q, scale, w_norm, w_err


__all__ = ["screen_resolve_row", "screen_table_terms"]
