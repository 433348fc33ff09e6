"""The numba-compiled steps of the CTC prefix beam search (used by :mod:`oasr_kernels.ctc`).

Data layout (all numpy arrays, grown by the caller):

- trie ``ti[node] = (parent, token, length, context state)``, ``tf[node]`` = context bonus; node 0 is
  the empty prefix.  ``h_keys/h_vals``: open-addressing hash table ``parent * vocab + token → node``,
  so every prefix has exactly one node.
- time lists ``li[n] = (previous node or -1, frame)``, ``lf[n]`` = log-prob of the token there: the
  emission frames of a prefix's Viterbi alignment, shared between prefixes (persistent lists).
- beam ``bi[j] = (node, blank-path times, non-blank-path times)``, ``bf[j] = (log-add of the two
  scores, blank-ending score, non-blank-ending score, Viterbi blank, Viterbi non-blank)``.
- ``counts = [trie nodes, time nodes, beam size, frames consumed]``.

A frame's table of prefixes (WeNet's ``next_hyps``) is ``ei``/``ef`` (columns ``E_*``/``F_*``): one
entry per beam prefix (reached by blank or a repeated label) and one per (beam prefix, label)
extension, in the order the reference first reaches them.  An extension equal to a beam prefix
shares that prefix's entry; any other is kept as (parent, label) and becomes a trie node — and its
new emission time a list node — only if it survives pruning.
"""

from __future__ import annotations

import math

import numba
import numpy as np

NEG_INF = -np.inf
# top-k search: vocabulary blocks of this many ids are skipped when their maximum is too small
BLOCK = 64

# trie / time-list / beam columns
T_PARENT, T_TOKEN, T_LEN, T_CTX = 0, 1, 2, 3
L_PREV, L_FRAME = 0, 1
B_NODE, B_TIMES_BLANK, B_TIMES = 0, 1, 2
S_TOTAL, S_BLANK, S_NONBLANK, S_VBLANK, S_VNONBLANK = 0, 1, 2, 3, 4
# frame-table columns: integer (E_*) and float (F_*)
E_NODE, E_PARENT, E_TOKEN, E_CTX, E_TIMES_BLANK, E_TIMES, E_NEW, E_NEW_PREV, E_NEW_FRAME = range(9)
F_BLANK, F_NONBLANK, F_VBLANK, F_VNONBLANK, F_PEAK, F_BONUS, F_NEW_LP, F_TOTAL, F_KEY = range(9)


@numba.njit(cache=True)
def log_add(a, b):
    """WeNet's log-add; with one side -inf the formula returns the other side exactly, so skip it."""
    if a == NEG_INF:
        return b
    if b == NEG_INF:
        return a
    m = a if a >= b else b
    return m + math.log(math.exp(a - m) + math.exp(b - m))


# -- top-k --------------------------------------------------------------------------------------------
@numba.njit(cache=True)
def _insert_top(v, i, n, k, out_v, out_i):
    """Insert (v, i) into the sorted top list (largest first, equal values keep arrival order)."""
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


@numba.njit(cache=True)
def _scan_top(row, start, stop, floor, n, k, out_v, out_i):
    """Offer ``row[start:stop]`` to the top list; values under ``floor`` are known not to belong."""
    for i in range(start, stop):
        v = row[i]
        if v < floor or (n == k and not v > out_v[k - 1]):
            continue
        n = _insert_top(np.float64(v), i, n, k, out_v, out_i)
    return n


@numba.njit(cache=True)
def topk(row, k, out_v, out_i, block_max, block_v, block_i):
    """The k largest of ``row``, largest first, equal values by lower index; returns the count.

    ``block_max`` holds the maxima of the row's full blocks of ``BLOCK`` values (or nothing).  The
    k-th largest block maximum is a floor: k values reach it, so nothing below it is in the top k.
    Only blocks whose maximum reaches the floor (and beats the k values already held) are scanned,
    then the tail after the last full block, all in index order.
    """
    nb = block_max.shape[0]
    if nb <= k:
        return _scan_top(row, 0, row.shape[0], NEG_INF, 0, k, out_v, out_i)
    n = 0
    for b in range(nb):
        n = _insert_top(np.float64(block_max[b]), b, n, k, block_v, block_i)
    floor = block_v[k - 1]
    n = 0
    for b in range(nb):
        top = np.float64(block_max[b])
        if top >= floor and (n < k or top > out_v[k - 1]):
            n = _scan_top(row, b * BLOCK, (b + 1) * BLOCK, floor, n, k, out_v, out_i)
    return _scan_top(row, nb * BLOCK, row.shape[0], floor, n, k, out_v, out_i)


# -- trie, hash table, time lists, context ------------------------------------------------------------
@numba.njit(cache=True)
def _slot(key, mask):
    x = np.uint64(key)
    x ^= x >> np.uint64(33)
    x *= np.uint64(0xFF51AFD7ED558CCD)
    x ^= x >> np.uint64(33)
    return np.int64(x & np.uint64(mask))


@numba.njit(cache=True)
def _hash_get(h_keys, h_vals, key):
    mask = h_keys.shape[0] - 1
    i = _slot(key, mask)
    while h_keys[i] != -1:
        if h_keys[i] == key:
            return h_vals[i]
        i = (i + 1) & mask
    return -1


@numba.njit(cache=True)
def _hash_put(h_keys, h_vals, key, value):
    mask = h_keys.shape[0] - 1
    i = _slot(key, mask)
    while h_keys[i] != -1 and h_keys[i] != key:
        i = (i + 1) & mask
    h_keys[i] = key
    h_vals[i] = value


@numba.njit(cache=True)
def context_step(state, token, ctx):
    """(score change, next state) for ``token`` from ``state`` (see oasr.decoding.context)."""
    c_start, c_token, c_state, c_fail, c_node, c_out = ctx
    s = state
    while True:
        lo = c_start[s]
        hi = c_start[s + 1]
        while lo < hi:
            mid = (lo + hi) // 2
            if c_token[mid] < token:
                lo = mid + 1
            else:
                hi = mid
        if lo < c_start[s + 1] and c_token[lo] == token:
            nxt = c_state[lo]
            break
        if s == 0:
            nxt = 0
            break
        s = c_fail[s]
    return c_node[nxt] - c_node[state] + c_out[nxt], nxt


@numba.njit(cache=True)
def _child(node, token, ctx_state, bonus, vocab, counts, ti, tf, h_keys, h_vals):
    """The trie node of prefix ``node`` + ``token``, created (with its context state) if new."""
    key = node * vocab + token
    child = _hash_get(h_keys, h_vals, key)
    if child >= 0:
        return child
    child = counts[0]
    counts[0] += 1
    ti[child, T_PARENT] = node
    ti[child, T_TOKEN] = token
    ti[child, T_LEN] = ti[node, T_LEN] + 1
    ti[child, T_CTX] = ctx_state
    tf[child] = bonus
    _hash_put(h_keys, h_vals, key, child)
    return child


@numba.njit(cache=True)
def _times_node(prev, frame, lp, counts, li, lf):
    n = counts[1]
    counts[1] += 1
    li[n, L_PREV] = prev
    li[n, L_FRAME] = frame
    lf[n] = lp
    return n


# -- one frame ----------------------------------------------------------------------------------------
@numba.njit(cache=True)
def _new_entry(ei, ef, e, node, parent, token, ctx_state, bonus):
    ei[e, E_NODE] = node
    ei[e, E_PARENT] = parent
    ei[e, E_TOKEN] = token
    ei[e, E_CTX] = ctx_state
    ei[e, E_TIMES_BLANK] = -1
    ei[e, E_TIMES] = -1
    ei[e, E_NEW] = 0
    ef[e, F_BLANK] = NEG_INF
    ef[e, F_NONBLANK] = NEG_INF
    ef[e, F_VBLANK] = NEG_INF
    ef[e, F_VNONBLANK] = NEG_INF
    ef[e, F_PEAK] = NEG_INF
    ef[e, F_BONUS] = bonus


@numba.njit(cache=True)
def _same_entry(j, node, same, ne, ei, ef, ti, tf):
    """The frame-table entry of beam prefix ``j`` (created on first use); returns (entry, count)."""
    e = same[j]
    if e < 0:
        e = ne
        ne += 1
        _new_entry(ei, ef, e, node, -1, -1, ti[node, T_CTX], tf[node])
        same[j] = e
    return e, ne


@numba.njit(cache=True)
def _set_new_time(ei, ef, e, prev, frame, lp):
    ei[e, E_NEW] = 1
    ei[e, E_NEW_PREV] = prev
    ei[e, E_NEW_FRAME] = frame
    ef[e, F_NEW_LP] = lp


@numba.njit(cache=True)
def _expand(frame, nc, cand_v, cand_i, beam, blank, bi, bf, viterbi, viterbi_times, ti, tf, li, ei, ef, same,
            child_head, child_next, top_new, top_new_i, has_ctx, ctx):
    """Fill the frame table from every (label, beam prefix) pair, as WeNet's loop does; returns its size.

    ``viterbi``/``viterbi_times``: each beam prefix's best alignment score and its emission times."""
    nbeam = same.shape[0]
    ne = 0
    n_new = 0
    for c in range(nc):
        u = cand_i[c]
        p = cand_v[c]
        for j in range(nbeam):
            node = bi[j, B_NODE]
            if u == blank or (ti[node, T_LEN] > 0 and u == ti[node, T_TOKEN]):
                e, ne = _same_entry(j, node, same, ne, ei, ef, ti, tf)
                if u == blank:
                    ef[e, F_BLANK] = log_add(ef[e, F_BLANK], bf[j, S_TOTAL] + p)
                    ef[e, F_VBLANK] = viterbi[j] + p
                    ei[e, E_TIMES_BLANK] = viterbi_times[j]
                    continue
                # the label repeats without a blank between: the prefix stays
                ef[e, F_NONBLANK] = log_add(ef[e, F_NONBLANK], bf[j, S_NONBLANK] + p)
                if ef[e, F_VNONBLANK] < bf[j, S_VNONBLANK] + p:
                    ef[e, F_VNONBLANK] = bf[j, S_VNONBLANK] + p
                    if ef[e, F_PEAK] < p:
                        ef[e, F_PEAK] = p
                        last = bi[j, B_TIMES]
                        _set_new_time(ei, ef, e, li[last, L_PREV] if last >= 0 else -1, frame, p)
                # after a blank the label is a new token
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
                    e, ne = _same_entry(i, bi[i, B_NODE], same, ne, ei, ef, ti, tf)
                    break
                i = child_next[i]
            if e < 0:
                state = 0
                bonus = 0.0
                if has_ctx:
                    delta, state = context_step(ti[node, T_CTX], u, ctx)
                    bonus = tf[node] + delta
                # a new extension is reached only here, so its rank key is final now; if `beam`
                # earlier new extensions rank at least as high, it cannot survive: skip it
                rank = from_score + p + bonus
                if n_new == beam and not rank > top_new[beam - 1]:
                    continue
                n_new = _insert_top(rank, 0, n_new, beam, top_new, top_new_i)
                e = ne
                ne += 1
                _new_entry(ei, ef, e, -1, node, u, state, bonus)
            ef[e, F_NONBLANK] = log_add(ef[e, F_NONBLANK], from_score + p)
            if ef[e, F_VNONBLANK] < from_viterbi + p:
                ef[e, F_VNONBLANK] = from_viterbi + p
                ef[e, F_PEAK] = p
                _set_new_time(ei, ef, e, from_times, frame, p)
    return ne


@numba.njit(cache=True)
def _select(ne, beam, vocab, counts, ei, ef, ti, tf, h_keys, h_vals, li, lf, order, bi, bf):
    """Keep the best ``beam`` entries — a stable sort by score plus bonus, equal keys in first-reached
    order — make their trie and time nodes, and write them as the new beam; returns its size."""
    kept = 0
    for e in range(ne):
        ef[e, F_TOTAL] = log_add(ef[e, F_BLANK], ef[e, F_NONBLANK])
        ef[e, F_KEY] = ef[e, F_TOTAL] + ef[e, F_BONUS]
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
            node = _child(ei[e, E_PARENT], ei[e, E_TOKEN], ei[e, E_CTX], ef[e, F_BONUS], vocab, counts, ti, tf,
                          h_keys, h_vals)
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


@numba.njit(cache=True)
def advance(lp, block_max, k, beam, blank, skip_log, vocab, counts, ti, tf, h_keys, h_vals, li, lf, bi, bf,
            has_ctx, ctx):
    """Advance one stream by the frames of ``lp`` (T, V); ``block_max`` (T, blocks) feeds :func:`topk`."""
    m = beam * (k + 1)
    ei = np.empty((m, 9), np.int64)
    ef = np.empty((m, 9), np.float64)
    cand_v = np.empty(k, np.float64)
    cand_i = np.empty(k, np.int64)
    block_v = np.empty(k, np.float64)
    block_i = np.empty(k, np.int64)
    top_new = np.empty(beam, np.float64)
    top_new_i = np.empty(beam, np.int64)
    order = np.empty(beam, np.int64)
    new_bi = np.empty((beam, 3), np.int64)
    new_bf = np.empty((beam, 5), np.float64)
    same_buf = np.empty(beam, np.int64)
    viterbi = np.empty(beam, np.float64)
    viterbi_times = np.empty(beam, np.int64)
    head_buf = np.empty(beam, np.int64)
    next_buf = np.empty(beam, np.int64)
    for t in range(lp.shape[0]):
        blank_lp = np.float64(lp[t, blank])
        if blank_lp >= skip_log:
            nc = 1
            cand_v[0] = blank_lp
            cand_i[0] = blank
        else:
            nc = topk(lp[t], k, cand_v, cand_i, block_max[t], block_v, block_i)
        nbeam = counts[2]
        same = same_buf[:nbeam]
        same[:] = -1
        # beam prefixes that extend another beam prefix by one label
        child_head = head_buf[:nbeam]
        child_head[:] = -1
        child_next = next_buf[:nbeam]
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
        ne = _expand(counts[3], nc, cand_v, cand_i, beam, blank, bi, bf, viterbi, viterbi_times, ti, tf, li, ei, ef,
                     same, child_head, child_next, top_new, top_new_i, has_ctx, ctx)
        kept = _select(ne, beam, vocab, counts, ei, ef, ti, tf, h_keys, h_vals, li, lf, order, new_bi, new_bf)
        bi[:kept] = new_bi[:kept]
        bf[:kept] = new_bf[:kept]
        counts[2] = kept
        counts[3] += 1


# -- upkeep and results -------------------------------------------------------------------------------
@numba.njit(cache=True)
def compact(counts, vocab, ti, tf, h_keys, h_vals, li, lf, bi):
    """Drop trie and time-list nodes the beam cannot reach; renumber the rest in place (their order,
    and so every parent-before-child relation, is kept) and rebuild the hash table."""
    n_nodes = counts[0]
    n_times = counts[1]
    live = np.zeros(n_nodes, np.bool_)
    live[0] = True
    live_t = np.zeros(n_times, np.bool_)
    for j in range(counts[2]):
        node = bi[j, B_NODE]
        while not live[node]:
            live[node] = True
            node = ti[node, T_PARENT]
        for start in (bi[j, B_TIMES_BLANK], bi[j, B_TIMES]):
            n = start
            while n >= 0 and not live_t[n]:
                live_t[n] = True
                n = li[n, L_PREV]
    new_id = np.full(n_nodes, -1, np.int64)
    m = 0
    for i in range(n_nodes):
        if live[i]:
            new_id[i] = m
            ti[m] = ti[i]
            ti[m, T_PARENT] = new_id[ti[i, T_PARENT]] if i > 0 else -1
            tf[m] = tf[i]
            m += 1
    new_t = np.full(n_times, -1, np.int64)
    q = 0
    for i in range(n_times):
        if live_t[i]:
            new_t[i] = q
            prev = li[i, L_PREV]
            li[q, L_FRAME] = li[i, L_FRAME]
            li[q, L_PREV] = new_t[prev] if prev >= 0 else -1
            lf[q] = lf[i]
            q += 1
    for j in range(counts[2]):
        bi[j, B_NODE] = new_id[bi[j, B_NODE]]
        for c in (B_TIMES_BLANK, B_TIMES):
            bi[j, c] = new_t[bi[j, c]] if bi[j, c] >= 0 else -1
    h_keys[:] = -1
    for i in range(1, m):
        _hash_put(h_keys, h_vals, ti[i, T_PARENT] * vocab + ti[i, T_TOKEN], i)
    counts[0] = m
    counts[1] = q


@numba.njit(cache=True)
def backtrack(node, times, ti, li, lf, tokens, frames, lps):
    """Fill ``tokens`` with the prefix of ``node`` and ``frames``/``lps`` with the time list ending at
    ``times`` (both as long as the prefix)."""
    i = tokens.shape[0]
    while node > 0:
        i -= 1
        tokens[i] = ti[node, T_TOKEN]
        node = ti[node, T_PARENT]
    i = frames.shape[0]
    while times >= 0 and i > 0:
        i -= 1
        frames[i] = li[times, L_FRAME]
        lps[i] = lf[times]
        times = li[times, L_PREV]
