"""Linears over a few rows (a decode step's): the ``row_linear`` kernel slot, with the reference as fallback.

A decode step at one to a few rows runs each linear as a matrix-vector product: its time is the weight's bytes
and the call's fixed cost.  ``F.linear`` takes MKL's sgemm there; ``oasr-kernels`` registers a plain
row-by-row dot-product loop (numba) under the slot ``row_linear`` that measures 1.3–2.5x faster at one row on
one AVX-512 thread (docs/benchmarks.md § Whisper), with the bias and a residual add in the same pass.

:func:`row_linear` takes that kernel where it computes what the reference computes up to float rounding:
CPU float32 inference (no autograd, not tracing), a float32 :class:`~oasr.layers.Linear` at most ``max_rows``
(:data:`MAX_ROWS`) rows, ``OASR_KERNELS`` not switched off and the kernel registered.  An int8 linear
(:mod:`oasr.layers.quant`) at up to :data:`MAX_INT8_ROWS` rows takes it too: its int8 weights times their
per-row scales against the activations rounded to a 16-bit grid of each row's absolute maximum (in effect
weight-only), which is closer to the float32 linear than fbgemm's dynamic GEMM (which rounds the activations to
8 bits) and faster at these rows.  Everywhere else it runs the module itself (and the add).
"""

from __future__ import annotations

import torch

from oasr.layers._backend import kernel
from oasr.layers.linear import Linear, LinearActivation

#: the most rows the kernel takes a float32 linear at by default: from ~8 rows on MKL's blocked GEMM is faster
#: on a hot weight
MAX_ROWS = 4
#: ... and an int8 linear at (16-bit activations): up to 4 rows it is faster than fbgemm's dynamic int8 GEMM on a
#: decoder step's 384 x 384 to 1536 x 384 weights (20-36 against 28-38 us at one row, 33-88 against 46-62 us at
#: four on one AVX-512 VNNI core, hot); from 8 rows on fbgemm is
MAX_INT8_ROWS = 4


def few_rows(x: torch.Tensor, max_rows: int | None = None) -> bool:
    """Whether ``x`` (…, in) is a CPU float32 inference input of at most ``max_rows`` (:data:`MAX_ROWS`) rows."""
    limit = MAX_ROWS if max_rows is None else max_rows
    return (x.is_cpu and x.dtype == torch.float32 and x.numel() <= limit * x.shape[-1]
            and not torch.is_grad_enabled() and not torch.jit.is_tracing() and not torch.jit.is_scripting())


def row_linear(linear: Linear, x: torch.Tensor, residual: torch.Tensor | None = None, *,
               max_rows: int | None = None) -> torch.Tensor:
    """``linear(x)`` (+ ``residual``, added after the activation of a :class:`LinearActivation`), through the
    ``row_linear`` kernel for a float32 linear at up to ``max_rows`` rows of CPU inference, else the module."""
    weight = linear.weight
    int8 = linear._int8 is not None
    if int8:
        usable = weight.dtype == torch.int8 and few_rows(x, MAX_INT8_ROWS if max_rows is None else max_rows)
    else:
        usable = weight.dtype == torch.float32 and few_rows(x, max_rows)
    fn = kernel("row_linear") if usable and weight.is_cpu else None
    if fn is None:
        out = linear(x)
        return out if residual is None else out + residual
    scale = linear.weight_scale if int8 else None
    if isinstance(linear, LinearActivation):
        out = linear._act(_run(fn, x, weight, linear.bias, None, scale))
        return out if residual is None else out + residual
    return _run(fn, x, weight, linear.bias, residual, scale)


def row_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                max_rows: int | None = None) -> torch.Tensor | None:
    """``x @ weight.T + bias`` through the ``row_linear`` kernel for a float32 (out, in) ``weight`` that is not a
    module's (a stacked or tied copy), or None where :func:`row_linear` would not take the kernel."""
    if not (weight.dtype == torch.float32 and weight.is_cpu and weight.is_contiguous() and few_rows(x, max_rows)):
        return None
    fn = kernel("row_linear")
    return None if fn is None else _run(fn, x, weight, bias)


def _run(fn, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None = None,
         scale: torch.Tensor | None = None) -> torch.Tensor:
    """The kernel ``fn`` over ``x`` (…, in) flattened to contiguous rows; the output (…, out)."""
    out_features = weight.shape[0]
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    res = None if residual is None else residual.reshape(-1, out_features).contiguous()
    out = fn(rows, weight.detach(), None if bias is None else bias.detach(), res, scale)
    return out.view(*x.shape[:-1], out_features)


__all__ = ["MAX_INT8_ROWS", "MAX_ROWS", "few_rows", "row_linear", "row_product"]
