"""Numba CPU kernels for linears over a few rows (kernel slot ``row_linear``).

At one to a few rows a linear is a matrix-vector product: it reads every weight once and does two flops per
weight, so its time is the weight's bytes.  torch's ``F.linear`` takes MKL's sgemm there, which at one row
costs 2.5–3x what a plain row-by-row dot product does on a 384 × 384 to 1536 × 384 weight (measured on one
AVX-512 thread, hot and cold, docs/benchmarks.md § Whisper); these loops read each weight row once, take
its dot product with every input row while it is in L1, and add the bias and an optional residual in the
same pass.  fastmath lets LLVM vectorize the dot products (sums reassociated: float rounding differs from
MKL's by a few ulps, as any other summation order does).

Weights are float32 ``(out, in)`` as stored, or int8 ``(out, in)`` with a float32 scale per output row.  The
int8 loop rounds each input row to a 16-bit grid of its own absolute maximum (at most 2^-16 of it, against the
weights' 2^-8: in effect weight-only) and sums int16 products in int32, which the vector units do at about twice
the float32 loop's rate.
"""

from __future__ import annotations

import numba
import numpy as np
import torch

_EMPTY = np.zeros(0, np.float32)


@numba.njit(cache=True, fastmath=True, boundscheck=False, nogil=True)
def _rows_f32(w, x, bias, residual, out):  # pragma: no cover - compiled
    rows, n_in = x.shape
    for o in range(w.shape[0]):
        b = bias[o] if bias.shape[0] else np.float32(0.0)
        for r in range(rows):
            acc = np.float32(0.0)
            for i in range(n_in):
                acc += w[o, i] * x[r, i]
            acc += b
            if residual.shape[0]:
                acc += residual[r, o]
            out[r, o] = acc


# the int8 loop's fallback for inputs holding inf or nan: no fastmath, which would assume there are none
@numba.njit(cache=True, boundscheck=False, nogil=True)
def _rows_i8_float(w, scale, x, bias, residual, out):  # pragma: no cover - compiled
    rows, n_in = x.shape
    row = np.empty(n_in, np.float32)  # one weight row dequantized once, then dotted with every input row
    for o in range(w.shape[0]):
        for i in range(n_in):
            row[i] = np.float32(w[o, i])
        b = bias[o] if bias.shape[0] else np.float32(0.0)
        for r in range(rows):
            acc = np.float32(0.0)
            for i in range(n_in):
                acc += row[i] * x[r, i]
            acc = acc * scale[o] + b
            if residual.shape[0]:
                acc += residual[r, o]
            out[r, o] = acc


@numba.njit(cache=True, boundscheck=False, nogil=True)
def _finite_amax(row):  # pragma: no cover - compiled
    """The row's largest absolute value, or -1 if it holds inf or nan: read from the float32 bits (an all-ones
    exponent), which no fastmath caller it is inlined into can assume away."""
    bits = row.view(np.uint32)
    amax = np.float32(0.0)
    for i in range(row.shape[0]):
        if (bits[i] & np.uint32(0x7F800000)) == np.uint32(0x7F800000):
            return np.float32(-1.0)
        amax = max(amax, abs(row[i]))
    return amax


#: output channels per pass of the int8 loop: their int32 sums are stored, then scaled (an int32 sum converted
#: to float in the dot product's own loop stops LLVM from vectorizing it)
_I8_BLOCK = 256


@numba.njit(cache=True, fastmath=True, boundscheck=False, nogil=True)
def _rows_i8(w, scale, x, bias, residual, out, step):  # pragma: no cover - compiled
    """``step`` (rows,): each row's grid step, written here (the activations used are ``step * xq``, within half a
    step of ``x`` up to float32 slop: ``x * (limit / amax)`` and ``step * (limit / amax)`` are each off by a few
    roundoffs, at most ~1e-6 * limit < 0.04 of a step); inf where the float32 loop ran instead."""
    rows, n_in = x.shape
    # each input row on a 16-bit grid of its own absolute maximum, as fine as int32 sums of n_in products
    # with int8 weights allow; the products are then int16 pairs summed into int32 (vpmaddwd), ~2x the
    # float32 loop's rate over the same int8 bytes
    limit = min(32767, 2147483647 // (127 * max(n_in, 1)))
    xq = np.empty((rows, n_in), np.int16)
    for r in range(rows):
        amax = _finite_amax(x[r])
        if amax < 0:  # inf or nan: the float32 loop carries them
            _rows_i8_float(w, scale, x, bias, residual, out)
            step[:] = np.inf
            return
        inv = np.float32(limit) / amax if amax > 0 else np.float32(0.0)
        for i in range(n_in):
            xq[r, i] = np.int16(np.rint(x[r, i] * inv))
        step[r] = amax / np.float32(limit)
    sums = np.empty((rows, _I8_BLOCK), np.int32)
    n_out = w.shape[0]
    for start in range(0, n_out, _I8_BLOCK):
        stop = min(start + _I8_BLOCK, n_out)
        for o in range(start, stop):
            for r in range(rows):
                acc = np.int32(0)
                for i in range(n_in):
                    acc += np.int32(np.int16(w[o, i]) * xq[r, i])
                sums[r, o - start] = acc
        for r in range(rows):
            for o in range(start, stop):
                value = np.float32(sums[r, o - start]) * step[r] * scale[o]
                if bias.shape[0]:
                    value += bias[o]
                if residual.shape[0]:
                    value += residual[r, o]
                out[r, o] = value


def row_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
               residual: torch.Tensor | None = None, scale: torch.Tensor | None = None,
               steps: np.ndarray | None = None) -> torch.Tensor:
    """``x @ weight.T (* scale) + bias (+ residual)`` for contiguous CPU tensors: ``x`` (rows, in) float32,
    ``weight`` (out, in) float32, or int8 with ``scale`` (out,) float32; ``bias`` (out,), ``residual``
    (rows, out) float32.  Returns a new (rows, out) float32 tensor.  With int8 weights, ``steps`` (rows,) float32
    receives each input row's grid step (every activation within half a step of the value used; inf for a row
    block that held inf or nan, which the float32 loop ran), e.g. for an error bound."""
    out = torch.empty((x.shape[0], weight.shape[0]), dtype=torch.float32)
    b = _EMPTY if bias is None else bias.numpy()
    res = _EMPTY.reshape(0, 0) if residual is None else residual.numpy()
    if scale is None:
        _rows_f32(weight.numpy(), x.numpy(), b, res, out.numpy())
    else:
        step = np.empty(x.shape[0], np.float32) if steps is None else steps
        _rows_i8(weight.numpy(), scale.numpy(), x.numpy(), b, res, out.numpy(), step)
    return out

