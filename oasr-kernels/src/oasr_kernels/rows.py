"""Numba CPU kernels for linears over a few rows (kernel slot ``row_linear``).

At one to a few rows a linear is a matrix-vector product: it reads every weight once and does two flops per
weight, so its time is the weight's bytes.  torch's ``F.linear`` takes MKL's sgemm there, which at one row
costs 2.5–3x what a plain row-by-row dot product does on a 384 × 384 to 1536 × 384 weight (measured on one
AVX-512 thread, hot and cold, docs/benchmarks.md § Whisper); these loops read each weight row once, take
its dot product with every input row while it is in L1, and add the bias and an optional residual in the
same pass.  fastmath lets LLVM vectorize the dot products (sums reassociated: float rounding differs from
MKL's by a few ulps, as any other summation order does).

Weights are float32 ``(out, in)`` as stored, or int8 ``(out, in)`` with a float32 scale per output row
(weight-only dequantization: the activations stay float32).
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


@numba.njit(cache=True, fastmath=True, boundscheck=False, nogil=True)
def _rows_i8(w, scale, x, bias, residual, out):  # pragma: no cover - compiled
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


def row_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
               residual: torch.Tensor | None = None, scale: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T (* scale) + bias (+ residual)`` for contiguous CPU tensors: ``x`` (rows, in) float32,
    ``weight`` (out, in) float32, or int8 with ``scale`` (out,) float32; ``bias`` (out,), ``residual``
    (rows, out) float32.  Returns a new (rows, out) float32 tensor."""
    out = torch.empty((x.shape[0], weight.shape[0]), dtype=torch.float32)
    b = _EMPTY if bias is None else bias.numpy()
    res = _EMPTY.reshape(0, 0) if residual is None else residual.numpy()
    if scale is None:
        _rows_f32(weight.numpy(), x.numpy(), b, res, out.numpy())
    else:
        _rows_i8(weight.numpy(), scale.numpy(), x.numpy(), b, res, out.numpy())
    return out

