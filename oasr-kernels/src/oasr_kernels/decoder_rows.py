"""Numba CPU kernel for one pre-norm Transformer decoder layer over a few rows (kernel slot ``decoder_layer_rows``).

A decode step at one to a few rows is a few dozen small operations per layer: three layer norms, six
matrix-vector products, two attention products over a key cache and over the encoder's keys, GELU and two
residual adds.  Run as torch ops each costs its dispatch and a pass over a fresh tensor, so on tiny.en a third
of a greedy token is overhead (docs/benchmarks.md § Whisper).  This kernel runs the whole layer in one call,
every intermediate in small scratch rows that stay in L1, and writes the row's key and value into the cache.

The layer (one row ``x`` of the residual stream; Whisper's decoder layer, pre-norm, exact GELU)::

    h = LN1(x);  q, k, v = h @ Wqkv.T + bqkv;  cache[pos] = k, v
    x += softmax(q . cache_k[:pos + 1] * s) cache_v[:pos + 1] @ Wo.T + bo        (per head; s = head_dim ** -0.5)
    h = LN2(x);  q = h @ Wcq.T + bcq
    x += softmax(q . cross_k * s) cross_v @ Wco.T + bco                          (the row's encoder entry)
    x += gelu(LN3(x) @ W1.T + b1) @ W2.T + b2

Each row has its own cache position (rows of different lengths need no mask) and its own encoder entry (beam
rows share their request's).  A linear's weight may be given as bfloat16 bits (uint16): it is read at half the
bytes and widened exactly to float32 in the loop (:func:`layer_weights`; the int8 model's step linears), or as
float16 bits (int16), and the cross-attention keys and values may be float16 too, widened the same way.
fastmath's reassociation lets LLVM vectorize the dot products, so sums are ordered differently from torch's (a few
ulps, as any other GEMM shape is); infinities and NaNs keep their meaning (no ``nnan`` / ``ninf``).
"""

from __future__ import annotations

import math

import numba
import numpy as np
import torch
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

_FAST = {"reassoc", "contract", "nsz", "arcp"}
_OPTS = dict(cache=True, fastmath=_FAST, boundscheck=False, nogil=True)


@intrinsic
def _bf16_to_float32(typingctx, bits):  # pragma: no cover - compiled
    """The float32 a bfloat16 (its 16 bits as uint16) holds: the bits shifted to the top half (LLVM zext, shl,
    bitcast; exact)."""
    if bits != types.uint16:
        return None

    def codegen(context, builder, signature, args):
        wide = builder.zext(args[0], ir.IntType(32))
        return builder.bitcast(builder.shl(wide, ir.Constant(ir.IntType(32), 16)), ir.FloatType())

    return types.float32(types.uint16), codegen


@intrinsic
def _fp16_to_float32(typingctx, bits):  # pragma: no cover - compiled
    """The float32 a float16 (its 16 bits as int16) holds (LLVM bitcast to half, fpext: exact; F16C's vcvtph2ps)."""
    if bits != types.int16:
        return None

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(types.int16), codegen


@intrinsic
def _int32_bits_to_float32(typingctx, bits):  # pragma: no cover - compiled
    """The float32 whose bits ``bits`` (int32) are (LLVM bitcast)."""
    if bits != types.int32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.int32), codegen


@numba.njit(inline="always", **_OPTS)
def _exp(x):  # pragma: no cover - compiled
    """exp(x) for float32 ``x <= 0`` (softmax weights), within 1 ulp of the true value down to -87 (e^-87 below
    that; NaN stays NaN).  A polynomial LLVM can vectorize: without SVML numba's ``math.exp`` is a scalar libm call
    per score (9.0 against 4.7 us per 1500-key softmax on one Xeon core, docs/benchmarks.md).  Range reduction
    x = n ln2 + r (ln2 split in two for an exact n ln2), then e^r to degree 7 (Cephes' expf coefficients), times
    2^n built from its exponent bits."""
    if x < np.float32(-87.0):
        x = np.float32(-87.0)
    n = math.floor(x * np.float32(1.4426950408889634) + np.float32(0.5))
    r = x - n * np.float32(0.693359375) + n * np.float32(2.12194440e-4)
    p = np.float32(1.9875691500e-4)
    p = p * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    return (p * (r * r) + r + np.float32(1.0)) * _int32_bits_to_float32(np.int32((np.int32(n) + 127) << 23))


def _weight(w, o, i):  # pragma: no cover - replaced by the overload below inside compiled code
    raise NotImplementedError


@overload(_weight, inline="always")
def _weight_impl(w, o, i):
    """``w[o, i]`` as float32: float32 values as stored, uint16 ones as the bfloat16 and int16 ones as the float16
    they hold."""
    if w.dtype == types.uint16:
        return lambda w, o, i: _bf16_to_float32(w[o, i])
    if w.dtype == types.int16:
        return lambda w, o, i: _fp16_to_float32(w[o, i])
    return lambda w, o, i: w[o, i]


def _key(k, e, h, j, t):  # pragma: no cover - replaced by the overload below inside compiled code
    raise NotImplementedError


@overload(_key, inline="always")
def _key_impl(k, e, h, j, t):
    """``k[e, h, j, t]`` as float32 (a cross-attention key cache of float32, or of float16 bits as int16)."""
    if k.dtype == types.int16:
        return lambda k, e, h, j, t: _fp16_to_float32(k[e, h, j, t])
    return lambda k, e, h, j, t: k[e, h, j, t]


@numba.njit(**_OPTS)
def _layer_norm(x, w, b, eps, out):  # pragma: no cover - compiled
    rows, d = x.shape
    for r in range(rows):
        mean = np.float32(0.0)
        for i in range(d):
            mean += x[r, i]
        mean /= d
        var = np.float32(0.0)
        for i in range(d):
            c = x[r, i] - mean
            var += c * c
        inv = np.float32(1.0) / np.float32(math.sqrt(var / d + eps))
        for i in range(d):
            out[r, i] = (x[r, i] - mean) * inv * w[i] + b[i]


@numba.njit(**_OPTS)
def _linear(w, b, x, out, accumulate):  # pragma: no cover - compiled
    """out = x @ w.T + b (accumulate: out += ...), one weight row at a time against every input row."""
    rows, n_in = x.shape
    for o in range(w.shape[0]):
        for r in range(rows):
            acc = np.float32(0.0)
            for i in range(n_in):
                acc += _weight(w, o, i) * x[r, i]
            if accumulate:
                out[r, o] += acc + b[o]
            else:
                out[r, o] = acc + b[o]


@numba.njit(**_OPTS)
def _softmax_weights(s, n):  # pragma: no cover - compiled
    """s[:n] = exp(s[:n] - max); returns their sum."""
    top = s[0]
    for t in range(1, n):
        top = max(top, s[t])
    total = np.float32(0.0)
    for t in range(n):
        e = _exp(s[t] - top)
        s[t] = e
        total += e
    return total


@numba.njit(**_OPTS)
def _attend_values(scores, n, values, acc, out):  # pragma: no cover - compiled
    """out = softmax(scores[:n]) @ values[:n]: the weights exponentiated in place, the sum taken, the values
    accumulated in ``acc`` (dh,), then divided once."""
    total = _softmax_weights(scores, n)
    dh = acc.shape[0]
    for j in range(dh):
        acc[j] = 0.0
    for t in range(n):
        wt = scores[t]
        for j in range(dh):
            acc[j] += wt * _weight(values, t, j)
    for j in range(dh):
        out[j] = acc[j] / total


@numba.njit(**_OPTS)
def _layer(x, pos, entry, ln1_w, ln1_b, qkv_w, qkv_b, self_k, self_v, o_w, o_b, ln2_w, ln2_b, cq_w, cq_b, cross_k,
           cross_v, co_w, co_b, ln3_w, ln3_b, fc1_w, fc1_b, fc2_w, fc2_b, eps):  # pragma: no cover - compiled
    rows, d = x.shape
    heads, dh = self_k.shape[1], self_k.shape[3]
    frames = cross_k.shape[3]
    scale = np.float32(1.0 / math.sqrt(dh))
    h = np.empty((rows, d), np.float32)
    qkv = np.empty((rows, 3 * d), np.float32)
    ctx = np.empty((rows, d), np.float32)
    acc = np.empty(dh, np.float32)
    scores = np.empty(max(frames, self_k.shape[2]), np.float32)

    # self-attention over the row's cache, its own key and value written first
    _layer_norm(x, ln1_w, ln1_b, eps[0], h)
    _linear(qkv_w, qkv_b, h, qkv, False)
    for r in range(rows):
        p = pos[r]
        for hd in range(heads):
            base = hd * dh
            for j in range(dh):
                self_k[r, hd, p, j] = qkv[r, d + base + j]
                self_v[r, hd, p, j] = qkv[r, 2 * d + base + j]
            for t in range(p + 1):
                s = np.float32(0.0)
                for j in range(dh):
                    s += qkv[r, base + j] * self_k[r, hd, t, j]
                scores[t] = s * scale
            _attend_values(scores, p + 1, self_v[r, hd], acc, ctx[r, base:base + dh])
    _linear(o_w, o_b, ctx, x, True)

    # cross-attention over the row's encoder entry (keys stored transposed: (heads, dh, frames))
    _layer_norm(x, ln2_w, ln2_b, eps[1], h)
    q = qkv[:, :d]
    _linear(cq_w, cq_b, h, q, False)
    for r in range(rows):
        e = entry[r]
        for hd in range(heads):
            base = hd * dh
            for t in range(frames):
                scores[t] = 0.0
            j = 0
            while j + 4 <= dh:  # four key rows per pass over the scores: four streams, a quarter of the stores
                q0, q1, q2, q3 = q[r, base + j], q[r, base + j + 1], q[r, base + j + 2], q[r, base + j + 3]
                for t in range(frames):
                    scores[t] += (q0 * _key(cross_k, e, hd, j, t) + q1 * _key(cross_k, e, hd, j + 1, t)
                                  + q2 * _key(cross_k, e, hd, j + 2, t) + q3 * _key(cross_k, e, hd, j + 3, t))
                j += 4
            while j < dh:
                qj = q[r, base + j]
                for t in range(frames):
                    scores[t] += qj * _key(cross_k, e, hd, j, t)
                j += 1
            for t in range(frames):
                scores[t] *= scale
            _attend_values(scores, frames, cross_v[e, hd], acc, ctx[r, base:base + dh])
    _linear(co_w, co_b, ctx, x, True)

    # the MLP: exact GELU between the two linears
    _layer_norm(x, ln3_w, ln3_b, eps[2], h)
    hidden = np.empty((rows, fc1_w.shape[0]), np.float32)
    _linear(fc1_w, fc1_b, h, hidden, False)
    for r in range(rows):
        for i in range(hidden.shape[1]):
            v = hidden[r, i]
            hidden[r, i] = np.float32(0.5) * v * (np.float32(1.0) + np.float32(math.erf(v * np.float32(0.7071067811865476))))
    _linear(fc2_w, fc2_b, hidden, x, True)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()


def _layer_rows(x: torch.Tensor, positions: torch.Tensor, entries: torch.Tensor, weights: tuple, self_k: torch.Tensor,
                self_v: torch.Tensor, cross_k: torch.Tensor, cross_v: torch.Tensor) -> None:
    """One decoder layer over ``x`` (rows, D) float32, updated in place (the residual stream).

    ``positions`` (rows,) int64: each row's cache position (its key and value are written there, attention runs
    over 0..position); ``entries`` (rows,) int64: each row's encoder entry; ``weights``: the layer's arrays as
    :func:`layer_weights` returns them; ``self_k`` / ``self_v`` (rows, H, capacity, Dh), ``cross_k`` (N, H, Dh, S)
    and ``cross_v`` (N, H, S, Dh): contiguous CPU float32 tensors, the cross-attention pair also float16 ones (read
    at half the bytes, widened exactly; the products in float32)."""
    w = weights
    _layer(x.numpy(), positions.numpy(), entries.numpy(), *w[:4], _np(self_k), _np(self_v), *w[4:10],
           _cache(cross_k), _cache(cross_v), *w[10:])


def _cache(t: torch.Tensor) -> np.ndarray:
    """A cross-attention cache as the kernel reads it: float32 as it is, float16 as its bits (int16)."""
    return _half_bits(t, torch.float16) if t.dtype == torch.float16 else t.numpy()


def _half_bits(t: torch.Tensor, dtype: torch.dtype) -> np.ndarray:
    """``t`` rounded to ``dtype`` (round to nearest even), its bits as the array the kernel widens: uint16 for
    bfloat16, int16 for float16."""
    bits = t.detach().to(dtype).contiguous().view(torch.int16).numpy()
    return bits.view(np.uint16) if dtype == torch.bfloat16 else bits


def layer_weights(ln1, qkv, out, ln2, cross_q, cross_out, ln3, fc1, fc2, eps, bf16=(False,) * 6) -> tuple:
    """The arrays :func:`decoder_layer_rows` takes for one layer: each layer norm and linear (the q/k/v stacked)
    as a (weight, bias) pair of float32 tensors (a missing bias as zeros), and the three norms' epsilons.
    ``bf16``: per linear (q/k/v, out, cross q, cross out, fc1, fc2), whether its weight is read as a bfloat16 copy
    (True), a float16 one (``torch.float16``) or as it is (False): half the bytes of a bandwidth-bound step, the
    products still accumulate in float32."""
    pairs = (ln1, qkv, out, ln2, cross_q, cross_out, ln3, fc1, fc2)
    halves = dict(zip((1, 2, 4, 5, 7, 8), bf16, strict=True))
    arrays = []
    for k, (weight, bias) in enumerate(pairs):
        half = halves.get(k)
        if half:
            arrays.append(_half_bits(weight, torch.float16 if half is torch.float16 else torch.bfloat16))
        else:
            arrays.append(np.ascontiguousarray(_np(weight), dtype=np.float32))
        arrays.append(np.ascontiguousarray(_np(bias), dtype=np.float32))
    return (*arrays, np.asarray(eps, np.float32))


class DecoderLayerRows:
    """The slot's callable: ``kernel(x, positions, entries, weights, self_k, self_v, cross_k, cross_v)`` runs one
    layer (:func:`_layer_rows`); ``kernel.prepare(...)`` builds a layer's ``weights`` once (:func:`layer_weights`)."""

    __call__ = staticmethod(_layer_rows)
    prepare = staticmethod(layer_weights)


decoder_layer_rows = DecoderLayerRows()

__all__ = ["DecoderLayerRows", "decoder_layer_rows", "layer_weights"]
