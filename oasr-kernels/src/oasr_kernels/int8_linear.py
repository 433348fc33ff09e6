"""Numba passes around oneDNN's int8 GEMM for a block of rows through int8 linears (kernel slot ``int8_linear``): the
activations' quantization in one pass, ``torch._int_mm`` (VNNI, exact int32 sums), the dequantization with the bias
and a residual add in one pass.

With one plane it computes what :class:`oasr.layers.quant.Int8Weight` computes for a block through fbgemm's dynamic
GEMM (the same grid; values on a rounding boundary may land on the other side), in fewer passes over the
activations than torch's scaling ops around fbgemm:

* each row is divided by its own absolute maximum (the per-row scale), then the block shares one uint8 grid over
  its [min, max] (widened to hold 0) with an integer zero point, as fbgemm's dynamic quantization picks them;
* the uint8 values are stored as int8 ``u - 128`` for ``torch._int_mm`` (int8 x int8), and the offset goes back
  in through the weights' row sums: ``sum_i (u_i - z) w_i = sum_i (u_i - 128) w_i + (128 - z) sum_i w_i``;
* the output is ``(that sum) * grid step * row scale * weight scale + bias (+ residual)``.

With two planes each row is its own symmetric grid (``amax / 127``) plus the remainder on a grid 254 times finer,
both int8, stacked as one GEMM of twice the rows: the activations to ~15 bits of their row's maximum, for inputs
whose outlier channels make one 8-bit grid too coarse for the rest (a GELU's output feeding Whisper's ``fc2``).
"""

from __future__ import annotations

import math

import numba
import numpy as np
import torch

from oasr_kernels.attention import available

_OPTS = dict(cache=True, fastmath=True, boundscheck=False, nogil=True, error_model="numpy")  # numpy: no zero-division branch in vector loops
#: the smallest per-row scale (an all-zero row stays zero under any positive scale)
_TINY = np.float32(np.finfo(np.float32).tiny)


@numba.njit(**_OPTS)
def _row_scales(x, rscale):  # pragma: no cover - compiled
    """Each row's absolute maximum (at least the smallest normal float) into ``rscale``; returns the block's
    (min, max) of the rows divided by them."""
    rows, n = x.shape
    lo = np.float32(0.0)
    hi = np.float32(0.0)
    for r in range(rows):
        mn = np.float32(np.inf)
        mx = np.float32(-np.inf)
        for i in range(n):
            mn = min(mn, x[r, i])
            mx = max(mx, x[r, i])
        amax = max(max(-mn, mx), _TINY)
        rscale[r] = amax
        lo = min(lo, mn / amax)
        hi = max(hi, mx / amax)
    return lo, hi


@numba.njit(**_OPTS)
def _quantize_block(x, rscale, inv_step, zero, q):  # pragma: no cover - compiled
    """``q[r, i] = clamp(rint(x[r, i] / rscale[r] / step) + zero, 0, 255) - 128`` (int8)."""
    rows, n = x.shape
    for r in range(rows):
        inv = np.float32(1.0) / rscale[r]
        for i in range(n):
            u = np.rint((x[r, i] * inv) * inv_step) + zero
            q[r, i] = np.int8(min(max(u, np.float32(0.0)), np.float32(255.0)) - np.float32(128.0))


@numba.njit(**_OPTS)
def _quantize_planes(x, rscale, q):  # pragma: no cover - compiled
    """Two int8 planes per row: ``q[r]`` on the grid ``s = amax / 127`` of the row, ``q[rows + r]`` the remainder
    on ``s / 254`` (it is within half a step ``s``, so within 127 steps of the finer grid); ``rscale[r] = s``."""
    rows, n = x.shape
    for r in range(rows):
        amax = _TINY
        for i in range(n):
            amax = max(amax, abs(x[r, i]))
        s = amax / np.float32(127.0)
        fine = s / np.float32(254.0)
        inv, inv_fine = np.float32(1.0) / s, np.float32(1.0) / fine
        rscale[r] = s
        for i in range(n):
            c = min(max(np.rint(x[r, i] * inv), np.float32(-127.0)), np.float32(127.0))
            q[r, i] = np.int8(c)
            f = np.rint((x[r, i] - c * s) * inv_fine)
            q[rows + r, i] = np.int8(min(max(f, np.float32(-127.0)), np.float32(127.0)))


@numba.njit(**_OPTS)
def _epilogue(acc, offset, rscale, step, wscale, bias, residual, out):  # pragma: no cover - compiled
    """``out[r, o] = (acc[r, o] + offset[o]) * rscale[r] * step * wscale[o] + bias[o] (+ residual[r, o])``."""
    rows, n_out = out.shape
    has_bias = bias.shape[0] > 0
    has_res = residual.shape[0] > 0
    for r in range(rows):
        a = rscale[r] * step
        for o in range(n_out):
            v = np.float32(acc[r, o] + offset[o]) * a * wscale[o]
            if has_bias:
                v += bias[o]
            if has_res:
                v += residual[r, o]
            out[r, o] = v


@numba.njit(**_OPTS)
def _epilogue_planes(acc, rscale, wscale, bias, residual, out):  # pragma: no cover - compiled
    """``out[r, o] = (acc[r, o] + acc[rows + r, o] / 254) * rscale[r] * wscale[o] + bias[o] (+ residual[r, o])``."""
    rows, n_out = out.shape
    has_bias = bias.shape[0] > 0
    has_res = residual.shape[0] > 0
    fine = np.float32(1.0 / 254.0)
    for r in range(rows):
        a = rscale[r]
        for o in range(n_out):
            v = (np.float32(acc[r, o]) + np.float32(acc[rows + r, o]) * fine) * a * wscale[o]
            if has_bias:
                v += bias[o]
            if has_res:
                v += residual[r, o]
            out[r, o] = v


def _grid(lo: float, hi: float) -> tuple[float, int]:
    """fbgemm's dynamic uint8 grid for values in [lo, hi]: its step (float32) and integer zero point, the range
    widened to hold 0 (with qmin = 0 the zero point from the minimum is the one of smaller error)."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    step = float(np.float32((hi - lo) / 255.0))
    if step == 0.0 or not math.isfinite(1.0 / step):
        step = float(np.float32(0.1))
    return step, int(min(max(round(-lo / step), 0), 255))


_EMPTY = np.empty(0, np.float32)


def int8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, weight_sums: torch.Tensor,
                bias: torch.Tensor | None = None, residual: torch.Tensor | None = None, planes: int = 1,
                activation: str = "none") -> torch.Tensor | None:
    """``x @ (weight * weight_scale[:, None]).T + bias (+ residual)`` with int8 activations: ``x`` (rows, in) float32
    contiguous CPU, rows > 16 and ``in`` a multiple of 8; ``weight`` (out, in) int8 contiguous, ``out`` a multiple
    of 8; ``weight_scale`` (out,) float32; ``weight_sums`` (out,) int32, the sums of ``weight``'s rows; ``residual``
    (rows, out) float32.  ``planes`` 1: fbgemm's dynamic grid (each row divided by its absolute maximum, one uint8
    grid over the block); 2: each row as two int8 planes (its own symmetric grid and the remainder on one 254 times
    finer: ~15 bits of the row's maximum, for activations with outlier channels), one GEMM over both.  ``activation``
    "gelu" (torch's exact GELU, in place; one plane, no residual).  Returns a new (rows, out)
    float32 tensor, or None where this torch has no CPU ``torch._int_mm`` or the activation is another."""
    if not available() or activation not in ("none", "gelu") or (activation != "none" and (planes == 2 or
                                                                                          residual is not None)):
        return None
    rows, n_in = x.shape
    xs = x.numpy()
    rscale = np.empty(rows, np.float32)
    out = torch.empty((rows, weight.shape[0]), dtype=torch.float32)
    res = _EMPTY.reshape(0, 0) if residual is None else residual.numpy()
    b = _EMPTY if bias is None else bias.detach().numpy()
    if planes == 2:
        q = torch.empty((2 * rows, n_in), dtype=torch.int8)
        _quantize_planes(xs, rscale, q.numpy())
        acc = torch._int_mm(q, weight.t())
        _epilogue_planes(acc.numpy(), rscale, weight_scale.numpy(), b, res, out.numpy())
        return out
    lo, hi = _row_scales(xs, rscale)
    step, zero = _grid(float(lo), float(hi))
    q = torch.empty((rows, n_in), dtype=torch.int8)
    _quantize_block(xs, rscale, np.float32(1.0 / step), np.float32(zero), q.numpy())
    acc = torch._int_mm(q, weight.t())
    offset = (weight_sums * (128 - zero)).numpy()
    _epilogue(acc.numpy(), offset, rscale, np.float32(step), weight_scale.numpy(), b, res, out.numpy())
    if activation == "gelu":
        torch.ops.aten.gelu_(out)  # torch's exact GELU in place (an erf approximation here flipped near-ties)
    return out


__all__ = ["available", "int8_linear"]
