"""CTC prefix beam search on the GPU, one block per utterance: kernel slot ``ctc_prefix_beam_search@cuda``.

:func:`ctc_prefix_beam_search` has the signature and results of
:func:`oasr.decoding.ctc.ctc_prefix_beam_search` (WeNet's search: the same n-best token sequences,
emission frames and float64 scores).  The data layout is the CPU kernel's (:mod:`oasr_kernels._prefix_beam`:
a trie of prefixes found through a hash table keyed by (parent, token), emission times as shared
linked lists, a per-frame table of candidate prefixes), held in per-utterance slices of global
memory sized for the utterance (at most ``beam`` new prefixes per frame), so nothing is compacted.

Per frame, the whole block finds the frame's ``k = min(beam, V)`` best labels — ``k`` rounds of a
block-wide argmax, each round taking the best value below the previous pick (ties: the lower id),
which is the CPU search's order — and then one thread extends the beam (``beam × k`` constant-time
updates) while the others wait.  The n-best is read back on the host from the final beam.

Under the simulator a block has two threads (each simulated barrier is costly; the feature kernels
cover deeper reductions).  Hotwords (``context``) are served by the CPU kernel (the log-probs are copied to the host for it).
Scores use the device's float64 ``log``/``exp``, which may differ from the host's in the last bit.
"""

from __future__ import annotations

import math

import numba
import numpy as np
import torch

from oasr.decoding.ctc import hypotheses, skip_log_threshold
from oasr.errors import ConfigError
from oasr_kernels._prefix_beam import (
    B_NODE,
    B_TIMES,
    B_TIMES_BLANK,
    E_NEW,
    E_NEW_FRAME,
    E_NEW_PREV,
    E_NODE,
    E_PARENT,
    E_TIMES,
    E_TIMES_BLANK,
    E_TOKEN,
    F_BLANK,
    F_KEY,
    F_NEW_LP,
    F_NONBLANK,
    F_PEAK,
    F_TOTAL,
    F_VBLANK,
    F_VNONBLANK,
    L_FRAME,
    L_PREV,
    S_BLANK,
    S_NONBLANK,
    S_TOTAL,
    S_VBLANK,
    S_VNONBLANK,
    T_LEN,
    T_PARENT,
    T_TOKEN,
)
from oasr_kernels.cuda import _runtime as rt
from oasr_kernels.cuda.ctc import check_batch

cuda = rt.cuda()
NEG_INF = -math.inf


@cuda.jit(device=True)
def _log_add(a, b):
    if a == NEG_INF:
        return b
    if b == NEG_INF:
        return a
    m = a if a >= b else b
    return m + math.log(math.exp(a - m) + math.exp(b - m))


@cuda.jit(device=True)
def _insert_top(v, i, n, k, out_v, out_i):
    if n == k and not v > out_v[k - 1]:
        return n
    j = n if n < k else k - 1
    while j > 0 and out_v[j - 1] < v:
        out_v[j] = out_v[j - 1]
        out_i[j] = out_i[j - 1]
        j -= 1
    out_v[j] = v
    out_i[j] = i
    return n + 1 if n < k else n


# -- trie, hash table, time lists ---------------------------------------------------------------------
@cuda.jit(device=True)
def _slot(key, mask):
    return (key ^ (key >> 17)) & mask


@cuda.jit(device=True)
def _child(node, token, vocab, counts, ti, h_keys, h_vals):
    """The trie node of prefix ``node`` + ``token``, created if new."""
    key = node * vocab + token
    mask = h_keys.shape[0] - 1
    s = _slot(key, mask)
    while h_keys[s] != -1:
        if h_keys[s] == key:
            return h_vals[s]
        s = (s + 1) & mask
    child = counts[0]
    counts[0] += 1
    ti[child, T_PARENT] = node
    ti[child, T_TOKEN] = token
    ti[child, T_LEN] = ti[node, T_LEN] + 1
    h_keys[s] = key
    h_vals[s] = child
    return child


@cuda.jit(device=True)
def _times_node(prev, frame, lp, counts, li, lf):
    n = counts[1]
    counts[1] += 1
    li[n, L_PREV] = prev
    li[n, L_FRAME] = frame
    lf[n] = lp
    return n


# -- one frame ----------------------------------------------------------------------------------------
@cuda.jit(device=True)
def _new_entry(ei, ef, e, node, parent, token):
    ei[e, E_NODE] = node
    ei[e, E_PARENT] = parent
    ei[e, E_TOKEN] = token
    ei[e, E_TIMES_BLANK] = -1
    ei[e, E_TIMES] = -1
    ei[e, E_NEW] = 0
    ef[e, F_BLANK] = NEG_INF
    ef[e, F_NONBLANK] = NEG_INF
    ef[e, F_VBLANK] = NEG_INF
    ef[e, F_VNONBLANK] = NEG_INF
    ef[e, F_PEAK] = NEG_INF


@cuda.jit(device=True)
def _same_entry(j, node, same, ne, ei, ef):
    e = same[j]
    if e < 0:
        e = ne
        ne += 1
        _new_entry(ei, ef, e, node, -1, -1)
        same[j] = e
    return e, ne


@cuda.jit(device=True)
def _set_new_time(ei, ef, e, prev, frame, lp):
    ei[e, E_NEW] = 1
    ei[e, E_NEW_PREV] = prev
    ei[e, E_NEW_FRAME] = frame
    ef[e, F_NEW_LP] = lp


@cuda.jit(device=True)
def _extend(e, from_score, from_viterbi, from_times, p, frame, ei, ef):
    ef[e, F_NONBLANK] = _log_add(ef[e, F_NONBLANK], from_score + p)
    if ef[e, F_VNONBLANK] < from_viterbi + p:
        ef[e, F_VNONBLANK] = from_viterbi + p
        ef[e, F_PEAK] = p
        _set_new_time(ei, ef, e, from_times, frame, p)


@cuda.jit(device=True)
def _expand(frame, nc, cand_v, cand_i, nbeam, beam, blank, bi, bf, viterbi, viterbi_times, ti, li, ei, ef, same,
            child_head, child_next, top_new, top_new_i):
    """The frame table from every (label, beam prefix) pair in WeNet's loop order; returns its size."""
    ne = 0
    n_new = 0
    for c in range(nc):
        u = cand_i[c]
        p = cand_v[c]
        for j in range(nbeam):
            node = bi[j, B_NODE]
            if u == blank or (ti[node, T_LEN] > 0 and u == ti[node, T_TOKEN]):
                e, ne = _same_entry(j, node, same, ne, ei, ef)
                if u == blank:
                    ef[e, F_BLANK] = _log_add(ef[e, F_BLANK], bf[j, S_TOTAL] + p)
                    ef[e, F_VBLANK] = viterbi[j] + p
                    ei[e, E_TIMES_BLANK] = viterbi_times[j]
                    continue
                # the label repeats without a blank between: the prefix stays
                ef[e, F_NONBLANK] = _log_add(ef[e, F_NONBLANK], bf[j, S_NONBLANK] + p)
                if ef[e, F_VNONBLANK] < bf[j, S_VNONBLANK] + p:
                    ef[e, F_VNONBLANK] = bf[j, S_VNONBLANK] + p
                    if ef[e, F_PEAK] < p:
                        ef[e, F_PEAK] = p
                        last = bi[j, B_TIMES]
                        _set_new_time(ei, ef, e, li[last, L_PREV] if last >= 0 else -1, frame, p)
                from_score = bf[j, S_BLANK]
                from_viterbi = bf[j, S_VBLANK]
                from_times = bi[j, B_TIMES_BLANK]
            else:
                from_score = bf[j, S_TOTAL]
                from_viterbi = viterbi[j]
                from_times = viterbi_times[j]
            # the prefix extended by u: a beam prefix's entry, or a new (parent, label) entry
            e = -1
            i = child_head[j]
            while i >= 0:
                if ti[bi[i, B_NODE], T_TOKEN] == u:
                    e, ne = _same_entry(i, bi[i, B_NODE], same, ne, ei, ef)
                    break
                i = child_next[i]
            if e < 0:
                # a new extension is reached only here: beyond `beam` better ones it cannot survive
                rank = from_score + p
                if n_new == beam and not rank > top_new[beam - 1]:
                    continue
                n_new = _insert_top(rank, 0, n_new, beam, top_new, top_new_i)
                e = ne
                ne += 1
                _new_entry(ei, ef, e, -1, node, u)
            _extend(e, from_score, from_viterbi, from_times, p, frame, ei, ef)
    return ne


@cuda.jit(device=True)
def _select(ne, beam, vocab, counts, ei, ef, ti, h_keys, h_vals, li, lf, order, bi, bf):
    """The best ``beam`` entries (stable: equal scores in first-reached order) become the new beam."""
    kept = 0
    for e in range(ne):
        ef[e, F_TOTAL] = _log_add(ef[e, F_BLANK], ef[e, F_NONBLANK])
        ef[e, F_KEY] = ef[e, F_TOTAL]
        if kept == beam and not ef[e, F_KEY] > ef[order[beam - 1], F_KEY]:
            continue
        j = kept if kept < beam else beam - 1
        while j > 0 and ef[order[j - 1], F_KEY] < ef[e, F_KEY]:
            order[j] = order[j - 1]
            j -= 1
        order[j] = e
        if kept < beam:
            kept += 1
    for j in range(kept):
        e = order[j]
        node = ei[e, E_NODE]
        if node < 0:
            node = _child(ei[e, E_PARENT], ei[e, E_TOKEN], vocab, counts, ti, h_keys, h_vals)
        times = ei[e, E_TIMES]
        if ei[e, E_NEW]:
            times = _times_node(ei[e, E_NEW_PREV], ei[e, E_NEW_FRAME], ef[e, F_NEW_LP], counts, li, lf)
        bi[j, B_NODE] = node
        bi[j, B_TIMES_BLANK] = ei[e, E_TIMES_BLANK]
        bi[j, B_TIMES] = times
        bf[j, S_TOTAL] = ef[e, F_TOTAL]
        bf[j, S_BLANK] = ef[e, F_BLANK]
        bf[j, S_NONBLANK] = ef[e, F_NONBLANK]
        bf[j, S_VBLANK] = ef[e, F_VBLANK]
        bf[j, S_VNONBLANK] = ef[e, F_VNONBLANK]
    return kept


@cuda.jit(device=True)
def _frame(frame, nc, cand_v, cand_i, beam, blank, vocab, counts, ti, h_keys, h_vals, li, lf, bi, bf, ei, ef,
           top_new, top_new_i, order, new_bi, new_bf, same, viterbi, viterbi_times, child_head, child_next):
    """Advance one utterance's beam by one frame (one thread)."""
    nbeam = counts[2]
    for i in range(nbeam):
        same[i] = -1
        child_head[i] = -1
    # each beam prefix's best alignment, and the beam prefixes that extend another by one label
    for i in range(nbeam):
        blank_path = bf[i, S_VBLANK] > bf[i, S_VNONBLANK]
        viterbi[i] = bf[i, S_VBLANK] if blank_path else bf[i, S_VNONBLANK]
        viterbi_times[i] = bi[i, B_TIMES_BLANK] if blank_path else bi[i, B_TIMES]
        if bi[i, B_NODE] != 0:
            parent = ti[bi[i, B_NODE], T_PARENT]
            for j in range(nbeam):
                if bi[j, B_NODE] == parent:
                    child_next[i] = child_head[j]
                    child_head[j] = i
                    break
    ne = _expand(frame, nc, cand_v, cand_i, nbeam, beam, blank, bi, bf, viterbi, viterbi_times, ti, li, ei, ef,
                 same, child_head, child_next, top_new, top_new_i)
    kept = _select(ne, beam, vocab, counts, ei, ef, ti, h_keys, h_vals, li, lf, order, new_bi, new_bf)
    for j in range(kept):
        for c in range(3):
            bi[j, c] = new_bi[j, c]
        for c in range(5):
            bf[j, c] = new_bf[j, c]
    counts[2] = kept
    counts[3] += 1


@cuda.jit(device=True)
def _block_topk(row, k, cand_v, cand_i, sv, si):
    """The ``k`` largest of ``row`` into ``cand_*`` (largest first, ties by lower id), the whole block
    working: round ``r`` takes the best value strictly after pick ``r - 1`` in that order."""
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    prev_v = math.inf
    prev_i = -1
    for r in range(k):
        best_v = NEG_INF
        best_i = -1
        for i in range(tid, row.shape[0], nt):
            v = row[i]
            if (v < prev_v or (v == prev_v and i > prev_i)) and (best_i < 0 or v > best_v):
                best_v = v
                best_i = i
        sv[tid] = best_v
        si[tid] = best_i
        cuda.syncthreads()
        step = nt // 2
        while step > 0:
            if tid < step:
                ov = sv[tid + step]
                oi = si[tid + step]
                if oi >= 0 and (si[tid] < 0 or ov > sv[tid] or (ov == sv[tid] and oi < si[tid])):
                    sv[tid] = ov
                    si[tid] = oi
            cuda.syncthreads()
            step //= 2
        prev_v = sv[0]
        prev_i = si[0]
        if tid == 0:
            cand_v[r] = prev_v
            cand_i[r] = prev_i
        cuda.syncthreads()


@cuda.jit
def _beam_kernel(lp, lengths, k, beam, blank, skip_log, counts, ti, h_keys, h_vals, li, lf, bi, bf, ei, ef,
                 cand_v, cand_i, top_new, top_new_i, order, new_bi, new_bf, same, viterbi, viterbi_times,
                 child_head, child_next):
    b = cuda.blockIdx.x
    sv = cuda.shared.array(rt.MAX_THREADS, numba.float64)
    si = cuda.shared.array(rt.MAX_THREADS, numba.int64)
    vocab = lp.shape[2]
    for t in range(lengths[b]):
        blank_lp = lp[b, t, blank]
        if blank_lp >= skip_log:
            nc = 1
            if cuda.threadIdx.x == 0:
                cand_v[b, 0] = blank_lp
                cand_i[b, 0] = blank
        else:
            nc = k
            _block_topk(lp[b, t], k, cand_v[b], cand_i[b], sv, si)
        cuda.syncthreads()
        if cuda.threadIdx.x == 0:
            _frame(t, nc, cand_v[b], cand_i[b], beam, blank, vocab, counts[b], ti[b], h_keys[b], h_vals[b], li[b],
                   lf[b], bi[b], bf[b], ei[b], ef[b], top_new[b], top_new_i[b], order[b], new_bi[b], new_bf[b],
                   same[b], viterbi[b], viterbi_times[b], child_head[b], child_next[b])
        cuda.syncthreads()


def _workspace(batch: int, longest: int, beam: int, k: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Per-utterance scratch: every frame adds at most ``beam`` trie nodes and time-list nodes."""
    nodes = 1 + longest * beam
    table = 1 << (2 * nodes - 1).bit_length()
    entries = beam * (k + 1)

    def ints(*shape, fill=0):
        return torch.full((batch, *shape), fill, dtype=torch.int64, device=device)

    def floats(*shape, fill=NEG_INF):
        return torch.full((batch, *shape), fill, dtype=torch.float64, device=device)

    ws = dict(counts=ints(4), ti=ints(nodes, 4), h_keys=ints(table, fill=-1), h_vals=ints(table),
              li=ints(nodes, 2), lf=floats(nodes, fill=0.0), bi=ints(beam, 3, fill=-1), bf=floats(beam, 5),
              ei=ints(entries, 9), ef=floats(entries, 9), cand_v=floats(k), cand_i=ints(k), top_new=floats(beam),
              top_new_i=ints(beam), order=ints(beam), new_bi=ints(beam, 3), new_bf=floats(beam, 5), same=ints(beam),
              viterbi=floats(beam), viterbi_times=ints(beam), child_head=ints(beam), child_next=ints(beam))
    # the start: the empty prefix (node 0), blank-ending with probability one
    ws["counts"][:] = torch.tensor([1, 0, 1, 0], device=device)
    ws["ti"][:, 0] = torch.tensor([-1, -1, 0, 0], device=device)
    ws["bi"][:, 0, B_NODE] = 0
    ws["bf"][:, 0] = torch.tensor([0.0, 0.0, NEG_INF, 0.0, 0.0], dtype=torch.float64, device=device)
    return ws


_ARGS = ("counts", "ti", "h_keys", "h_vals", "li", "lf", "bi", "bf", "ei", "ef", "cand_v", "cand_i", "top_new",
         "top_new_i", "order", "new_bi", "new_bf", "same", "viterbi", "viterbi_times", "child_head", "child_next")


def _nbest(ws: dict[str, np.ndarray], row: int, n: int) -> list[tuple[list[int], float, list[int], list[float]]]:
    counts, ti, li, lf = ws["counts"][row], ws["ti"][row], ws["li"][row], ws["lf"][row]
    bi, bf = ws["bi"][row], ws["bf"][row]
    out = []
    for j in range(int(counts[2])):
        score = float(bf[j, S_TOTAL])
        if score == NEG_INF:
            continue  # reached only through impossible alignments
        node = int(bi[j, B_NODE])
        times = int(bi[j, B_TIMES_BLANK] if bf[j, S_VBLANK] > bf[j, S_VNONBLANK] else bi[j, B_TIMES])
        tokens, frames, lps = [], [], []
        while node > 0:
            tokens.append(int(ti[node, T_TOKEN]))
            node = int(ti[node, T_PARENT])
        while times >= 0 and len(frames) < len(tokens):
            frames.append(int(li[times, L_FRAME]))
            lps.append(float(lf[times]))
            times = int(li[times, L_PREV])
        out.append((tokens[::-1], score, frames[::-1], lps[::-1]))
    return out[:n]


def ctc_prefix_beam_search(log_probs: torch.Tensor, lengths, beam_size: int = 10, n_best: int | None = None,
                           blank: int = 0, blank_skip_threshold: float | None = None, context=None):
    """:func:`oasr.decoding.ctc.ctc_prefix_beam_search` on the device (see the module docstring)."""
    if context is not None:
        from oasr_kernels.ctc import ctc_prefix_beam_search as host_search

        return host_search(log_probs.detach().float().cpu(), torch.as_tensor(lengths).cpu(), beam_size=beam_size,
                           n_best=n_best, blank=blank, blank_skip_threshold=blank_skip_threshold, context=context)
    rt.kernel_device(log_probs)
    if int(beam_size) < 1:
        raise ConfigError(f"beam_size must be at least 1, got {beam_size}", key="beam_size")
    if n_best is not None and int(n_best) < 1:
        raise ConfigError(f"n_best must be at least 1, got {n_best}", key="n_best")
    if blank_skip_threshold is not None and not 0.0 <= blank_skip_threshold <= 1.0:
        raise ConfigError(f"blank_skip_threshold is a probability in [0, 1], got {blank_skip_threshold}",
                          key="blank_skip_threshold")
    lengths = check_batch(log_probs, lengths, blank)
    batch, _, vocab = log_probs.shape
    longest = int(lengths.max().cpu()) if batch else 0
    beam = int(beam_size)
    k = min(beam, vocab)
    skip = skip_log_threshold(blank_skip_threshold)
    lp = log_probs.detach().float().contiguous()
    ws = _workspace(batch, longest, beam, k, lp.device)
    rt.launch(_beam_kernel, batch, rt.threads(vocab, sim_cap=2), rt.view(lp), rt.view(lengths), k, beam, int(blank),
              math.inf if skip is None else float(skip), *(rt.view(ws[name]) for name in _ARGS))
    host = {name: ws[name].cpu().numpy() for name in ("counts", "ti", "li", "lf", "bi", "bf")}
    return [hypotheses(_nbest(host, row, int(n_best or beam))) for row in range(batch)]
