"""Numba CPU kernel of an int8 self-attention core (kernel slot ``int8_attention``): softmax(q k^T s) v over
whole sequences (an encoder's), its two products on int8 with int32 accumulation (``torch._int_mm``, oneDNN's VNNI
GEMM), the softmax and the rounding between them in numba.

At 1500 frames (a Whisper window) the float32 core (SDPA's flash kernel) is bound by its multiply-adds: ~43 ms per
tiny.en layer on one core, a third of an int8 encoder.  The same products on int8 run at ~4x the rate.  Per batch
item and head, over blocks of query rows:

* **q k^T.**  k is quantized per channel (one scale per head dimension over all frames, as KV-cache quantizers do
  for keys: the channels differ in range, the frames much less), q per row after taking each channel's key scale,
  so a score is one int32 product times the query row's scale.  The product runs transposed, ``S^T = K Q^T``
  (frames x rows), so that the softmax below works on contiguous rows of its vector lanes.
* **softmax, rounded.**  The weights ``255 * exp(x - max)`` are rounded to integers 0..255 by error diffusion along
  the frames (each rounding error carried into the next frame's weight).  Plain rounding to 8 bits loses the many
  small weights of a diffuse row (1-7 % relative error of the output on tiny.en's layers); with the carry the
  error of a weighted sum of values is bounded by their differences between neighbouring frames instead of their
  size (0.1-0.3 %), at the cost of one int8 product.  The normalizer is the sum of the rounded weights, so they
  sum exactly to one.  ``exp`` is a degree-4 polynomial of ``2^x`` (relative error ~7e-6, far below the rounding).
* **weights v.**  v is quantized per channel; the weights are stored as ``w - 128`` (int8), the offset added back
  through v's column sums: ``sum_t w_t v_t = sum_t (w_t - 128) v_t + 128 sum_t v_t``.

Measured on tiny.en's encoder (docs/benchmarks.md, "int8 attention core"): output within ~0.5 % of the float32
core (relative Frobenius error), dominated by q k^T's rounding.
"""

from __future__ import annotations

import functools

import numba
import numpy as np
import torch
import torch.nn.functional as F

from oasr.layers.quant import _vnni
from oasr_kernels.decoder_rows import _int32_bits_to_float32

_FAST = {"reassoc", "contract", "nsz", "arcp"}
_OPTS = dict(cache=True, fastmath=_FAST, boundscheck=False, nogil=True)
_LOG2E = 1.4426950408889634
#: query rows per block: the (frames, rows) int32 scores and int8 weights stay in the L2 cache
BLOCK_ROWS = 128


@numba.njit(inline="always", **_OPTS)
def _exp2(x):  # pragma: no cover - compiled
    """2^x for float32 x <= 0 (2^-60 below -60): 2^floor(x) from its exponent bits times a degree-4 polynomial of the
    fraction (relative error ~7e-6)."""
    x = max(x, np.float32(-60.0))
    n = np.floor(x)
    f = x - n
    p = np.float32(1.3697664e-2)
    p = p * f + np.float32(5.1690358e-2)
    p = p * f + np.float32(2.4163024e-1)
    p = p * f + np.float32(6.9296750e-1)
    p = p * f + np.float32(1.0)
    return p * _int32_bits_to_float32(np.int32((np.int32(n) + 127) << 23))


@numba.njit(**_OPTS)
def _quantize(q, k, v, scale, qt, qa, kq, vt, vs, vcol):  # pragma: no cover - compiled
    """One batch item's q, k, v (T, H, D) float32 (any strides) to int8: ``kq`` (H, T, D) with per-channel scales;
    ``qt`` (H, D, T), q times the key scales, per row; ``qa`` (H, T): each query row's scale times ``scale`` and
    log2(e) (the scores in base 2); ``vt`` (H, D, T) per channel with scales ``vs`` (H, D) and ``vcol`` (H, D) =
    128 * the column sums of the int8 values (the weights' offset)."""
    frames, heads, dim = q.shape
    kmax = np.zeros((heads, dim), np.float32)
    vmax = np.zeros((heads, dim), np.float32)
    for t in range(frames):
        for h in range(heads):
            for j in range(dim):
                kmax[h, j] = max(kmax[h, j], abs(k[t, h, j]))
                vmax[h, j] = max(vmax[h, j], abs(v[t, h, j]))
    kscale = np.empty((heads, dim), np.float32)
    kinv = np.empty((heads, dim), np.float32)
    vinv = np.empty((heads, dim), np.float32)
    for h in range(heads):
        for j in range(dim):
            kscale[h, j] = kmax[h, j] / np.float32(127.0) if kmax[h, j] > 0 else np.float32(1.0)
            kinv[h, j] = np.float32(1.0) / kscale[h, j]
            vs[h, j] = vmax[h, j] / np.float32(127.0) if vmax[h, j] > 0 else np.float32(1.0)
            vinv[h, j] = np.float32(1.0) / vs[h, j]
    vsum = np.zeros((heads, dim), np.int32)
    row = np.empty(dim, np.float32)
    for t in range(frames):
        for h in range(heads):
            top = np.float32(0.0)
            for j in range(dim):
                kq[h, t, j] = np.int8(np.rint(k[t, h, j] * kinv[h, j]))
                r = np.int8(np.rint(v[t, h, j] * vinv[h, j]))
                vt[h, j, t] = r
                vsum[h, j] += np.int32(r)
                row[j] = q[t, h, j] * kscale[h, j]
                top = max(top, abs(row[j]))
            s = top / np.float32(127.0) if top > 0 else np.float32(1.0)
            qa[h, t] = s * scale * np.float32(_LOG2E)
            inv = np.float32(1.0) / s
            for j in range(dim):
                qt[h, j, t] = np.int8(np.rint(row[j] * inv))
    for h in range(heads):
        for j in range(dim):
            vcol[h, j] = np.float32(128.0) * np.float32(vsum[h, j])


@numba.njit(**_OPTS)
def _weights(st, a, pt, total, top, carry):  # pragma: no cover - compiled
    """The rounded softmax weights of a block: ``st`` (T, R) int32 scores (transposed), ``a`` (R,) each row's scale
    (base 2) -> ``pt`` (T, R) int8 = w - 128 with w in 0..255 rounded by error diffusion along T, ``total`` (R,)
    int32 = sum of w.  ``top`` / ``carry``: (R,) scratch."""
    frames, rows = st.shape
    for i in range(rows):
        top[i] = st[0, i]
        carry[i] = 0.0
        total[i] = 0
    for t in range(1, frames):
        for i in range(rows):
            top[i] = max(top[i], st[t, i])
    for t in range(frames):
        for i in range(rows):
            x = _exp2(np.float32(st[t, i] - top[i]) * a[i]) * np.float32(255.0) + carry[i]
            w = min(np.rint(x), np.float32(255.0))
            carry[i] = x - w
            iw = np.int32(w)
            total[i] += iw
            pt[t, i] = np.int8(iw - 128)


@numba.njit(**_OPTS)
def _finish(ot, vcol, vs, total, out, row0):  # pragma: no cover - compiled
    """out[row0 + i, j] = (ot[j, i] + vcol[j]) * vs[j] / total[i] (one head's output rows, (T, D) view)."""
    dim, rows = ot.shape
    for i in range(rows):
        inv = np.float32(1.0) / np.float32(total[i])
        for j in range(dim):
            out[row0 + i, j] = (np.float32(ot[j, i]) + vcol[j]) * vs[j] * inv


def int8_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                   out: torch.Tensor | None = None, block_rows: int = BLOCK_ROWS, *, int8: bool | None = None
                   ) -> torch.Tensor:
    """softmax(q k^T * scale) v per batch item and head, no mask: ``q``, ``k``, ``v`` (N, T, H, D) float32 CPU
    tensors (any strides, e.g. views of one fused q/k/v projection); returns (N, T, H, D) float32 (``out`` when
    given, contiguous).  The int8 scheme is the module's; the float32 core (SDPA) instead where it is not fast
    (:func:`fast`: no VNNI), or with ``int8=False``; ``int8=True`` runs the scheme wherever this torch has a CPU
    ``torch._int_mm``."""
    n_batch, frames, heads, dim = q.shape
    if out is None:
        out = torch.empty((n_batch, frames, heads, dim), dtype=torch.float32)
    if not (fast() if int8 is None else int8 and available()):
        exact = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=scale)
        return out.copy_(exact.transpose(1, 2))
    qt = torch.empty((heads, dim, frames), dtype=torch.int8)
    kq = torch.empty((heads, frames, dim), dtype=torch.int8)
    vt = torch.empty((heads, dim, frames), dtype=torch.int8)
    qa = np.empty((heads, frames), np.float32)
    vs = np.empty((heads, dim), np.float32)
    vcol = np.empty((heads, dim), np.float32)
    rows = min(block_rows, frames)
    flat = torch.empty(frames * rows, dtype=torch.int8)
    total = np.empty(rows, np.int32)
    top = np.empty(rows, np.int32)
    carry = np.empty(rows, np.float32)
    o = out.numpy()
    for n in range(n_batch):
        _quantize(q[n].detach().numpy(), k[n].detach().numpy(), v[n].detach().numpy(), np.float32(scale),
                  qt.numpy(), qa, kq.numpy(), vt.numpy(), vs, vcol)
        for h in range(heads):
            on = o[n, :, h, :]
            for r0 in range(0, frames, rows):
                r = min(rows, frames - r0)
                st = torch._int_mm(kq[h], qt[h, :, r0:r0 + r])
                pt = flat[:frames * r].view(frames, r)
                _weights(st.numpy(), qa[h, r0:r0 + r], pt.numpy(), total[:r], top[:r], carry[:r])
                ot = torch._int_mm(vt[h], pt)
                _finish(ot.numpy(), vcol[h], vs[h], total[:r], on, r0)
    return out


@functools.cache
def available() -> bool:
    """Whether this torch runs ``torch._int_mm`` on the CPU (oneDNN's int8 GEMM)."""
    try:
        a = torch.ones((32, 32), dtype=torch.int8)
        return bool(torch._int_mm(a, a)[0, 0] == 32)
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


@functools.cache
def fast() -> bool:
    """Whether the int8 scheme is the fast one here: :func:`available` and a CPU with VNNI.  Without VNNI oneDNN's
    int8 product is exact but slow: a tiny.en int8 encoder window took 8.8-9.7 s with this core against 0.78 s with
    SDPA on an AVX2 core (Zen 3)."""
    return _vnni() and available()


__all__ = ["BLOCK_ROWS", "available", "fast", "int8_attention"]
