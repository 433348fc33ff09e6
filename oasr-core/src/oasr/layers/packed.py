"""oneDNN-prepacked fp32 GEMMs for the waist's linears on CPU inference, with their epilogues fused.

``torch.nn.functional.linear`` runs MKL's sgemm on the plain ``(out, in)`` weight and leaves the
activation, the residual add and a constant scale (a Conformer's macaron ``½``) to separate passes over
the output.  Here a linear's weight is reordered once into oneDNN's blocked layout
(``mkldnn._reorder_linear_weight``) and run by ``mkldnn._linear_pointwise``, whose epilogue applies the bias, the activation (SiLU/ReLU/GELU)
or a residual add in the same pass.  A constant scale (the macaron ``½``, a subsampling's ``√d``) is
folded into the packed copy.  Measured at one thread on the WeNet Conformer's shapes (AVX-512): 92–102
GFLOP/s instead of 60–76 for the FFN GEMMs, the FFN with its SiLU 1.3–1.5x faster
(``benchmarks/wenet.py``, docs/benchmarks.md § WeNet); the FastConformer encoders take the same path
(``benchmarks/fastconformer.py``).  The packed copies cost a second copy of those weights in memory.

The packed copy is derived data, never a parameter: it is kept beside the module by
:func:`oasr.layers.derived.derived` (packs under the names ``("packed", ...)``, folds under ``"fold"``),
so ``load_state_dict``, ``.to()`` or an in-place edit of the weight repacks it on the next call.  The
fast path is taken only where it computes what the reference computes up to float rounding: CPU,
float32, no autograd, not tracing, an fp32 (not int8) linear, at least :data:`MIN_ROWS` rows, oneDNN
built in, and ``OASR_KERNELS`` not switched off.  Everywhere else the reference ops run (the same
module call, activation and adds).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.utils import _pair

from oasr.layers._backend import kernels_enabled
from oasr.layers.activation import activation_fn
from oasr.layers.derived import derived
from oasr.layers.linear import Linear
from oasr.layers.norm import BatchNorm1d

#: fewer rows than this take the reference path (skinny GEMMs gain least and stream the weights cold)
MIN_ROWS = 64
#: :func:`blocked` runs the GEMMs over row blocks of this many rows, the last one zero-padded up to a
#: multiple of :data:`MIN_ROWS`: oneDNN builds (and keeps) a primitive per shape, so a stream of varied
#: lengths must see few shapes — one per row count would grow the process by ~0.8 MB per new length
BLOCK_ROWS = 512
#: oneDNN post-op (attr, algorithm) per activation name the waist knows
_POST_OPS = {"swish": ("swish", ""), "silu": ("swish", ""), "relu": ("relu", ""), "gelu": ("gelu", "none"),
             "gelu_tanh": ("gelu", "tanh"), "identity": ("none", ""), "none": ("none", "")}

_IN_PLACE = {"swish": F.silu, "silu": F.silu, "relu": F.relu}


def _fast(linears: Sequence[nn.Module], x: torch.Tensor, min_rows: int = MIN_ROWS) -> bool:
    # called once per GEMM: ``is_cpu`` and one parameter lookup per linear (a module attribute or a
    # ``.device`` costs microseconds, a few % of a one-clip encoder's GEMM calls)
    if not x.is_cpu or x.dtype != torch.float32 or x.dim() < 2:
        return False
    if torch.is_grad_enabled() or torch.jit.is_tracing() or torch.jit.is_scripting():
        return False
    if x.numel() // x.size(-1) < min_rows or not torch.backends.mkldnn.is_available() or not kernels_enabled():
        return False
    for lin in linears:
        weight = lin.weight
        if getattr(lin, "_int8", None) is not None or weight.dtype != torch.float32 or not weight.is_cpu:
            return False
    return True


def _reference(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The plain linear of ``module`` (a waist Linear's own epilogue, e.g. an activation, left out)."""
    return Linear.forward(module, x) if isinstance(module, Linear) else module(x)


def _packed(linears: Sequence[nn.Module], scale: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The packed ``scale * cat(weights)`` and ``scale * cat(biases)`` (a missing bias is zeros), kept on the
    first linear per group (and rebuilt for another scale)."""

    def build():
        weights = [lin.weight.reshape(lin.weight.size(0), -1) for lin in linears]
        weight = torch.cat(weights) * scale
        if all(lin.bias is None for lin in linears):
            bias = None
        else:
            bias = torch.cat([lin.bias if lin.bias is not None else w.new_zeros(w.size(0))
                              for lin, w in zip(linears, weights, strict=True)]) * scale
        return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous()), bias

    return derived(linears[0], ("packed", *(id(lin) for lin in linears)),
                   [t for lin in linears for t in (lin.weight, lin.bias)], build, extra=scale)


def linear(module: nn.Module, x: torch.Tensor, activation: str = "none", *, scale: float = 1.0,
           min_rows: int = MIN_ROWS) -> torch.Tensor:
    """``activation(scale * module(x))`` for a waist :class:`~oasr.layers.Linear` or ``PointwiseConv1d``
    (any module whose call on (..., in) is the linear of its ``weight`` (out, in[, 1]) and ``bias``).

    ``min_rows`` (here and in the other GEMM helpers) lowers the row count the packed path needs, for
    callers that keep the number of distinct row counts small themselves (``blocked(few=True)``)."""
    if _fast((module,), x, min_rows) and activation in _POST_OPS:
        weight, bias = _packed((module,), scale)
        attr, algorithm = _POST_OPS[activation]
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, attr, [], algorithm)
    y = _reference(module, x)
    if scale != 1.0:
        y = y * scale
    if activation in _IN_PLACE and not torch.is_grad_enabled():  # y is this call's own fresh output
        return _IN_PLACE[activation](y, inplace=True)
    return activation_fn(activation)(y) if activation not in ("none", "identity") else y


def linear_add(module: nn.Module, x: torch.Tensor, residual: torch.Tensor, *, scale: float = 1.0,
               min_rows: int = MIN_ROWS) -> torch.Tensor:
    """``residual + scale * module(x)``: the residual add is the GEMM's epilogue."""
    if _fast((module,), x, min_rows) and residual.dtype == torch.float32 and residual.shape[:-1] == x.shape[:-1]:
        weight, bias = _packed((module,), scale)
        return torch.ops.mkldnn._linear_pointwise.binary(x, residual.contiguous(), weight, bias, "add")
    y = _reference(module, x)
    if not torch.is_grad_enabled() and y.shape == residual.shape and y.dtype == residual.dtype:
        return (y.mul_(scale) if scale != 1.0 else y).add_(residual)  # in place in this call's own output
    return residual + (y * scale if scale != 1.0 else y)


def linear_group(modules: Sequence[nn.Module], x: torch.Tensor, *, min_rows: int = MIN_ROWS) -> torch.Tensor:
    """``cat([m(x) for m in modules], -1)`` as one GEMM over the concatenated weights (e.g. q, k, v)."""
    if _fast(modules, x, min_rows):
        weight, bias = _packed(modules, 1.0)
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return torch.cat([_reference(m, x) for m in modules], dim=-1)


def fusable(modules: Sequence[nn.Module], x: torch.Tensor, *, min_rows: int = MIN_ROWS) -> bool:
    """Whether ``modules`` applied to ``x`` take the packed path (else callers keep their reference ops)."""
    return _fast(modules, x, min_rows)


def conv1d(module: nn.Module, x: torch.Tensor, activation: str = "none") -> torch.Tensor:
    """``activation(module.forward_bct(x))`` for a waist ``Conv1d`` on (B, C, T) with equal padding on
    both sides: on the fast path one oneDNN convolution with the activation in its epilogue."""
    left, right = module.padding
    if (left == right and activation in _POST_OPS and x.dim() == 3 and _fast((module,), x, 1)
            and (module.bias is None or module.bias.dtype == torch.float32)):
        attr, algorithm = _POST_OPS[activation]
        return torch.ops.mkldnn._convolution_pointwise(x, module.weight, module.bias, [left], [module.stride],
                                                       [module.dilation], module.groups, attr, [], algorithm)
    y = module.forward_bct(x)
    return activation_fn(activation)(y) if activation not in ("none", "identity") else y


def _folded_depthwise(conv: nn.Module, norm: nn.Module | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``conv``'s weight as (C, 1, 1, k) and its bias, with the inference batch norm ``norm`` (None: none)
    folded in; rebuilt when any source tensor changes (``load_state_dict``) or another norm comes."""
    sources = [conv.weight, conv.bias]
    if norm is not None:
        sources += [norm.weight, norm.bias, norm.running_mean, norm.running_var]

    def build():
        weight, bias = conv.weight, conv.bias
        if norm is not None:
            scale = norm.weight * torch.rsqrt(norm.running_var + norm.eps)
            shift = norm.bias - norm.running_mean * scale
            bias = shift if bias is None else shift + bias * scale
            weight = weight * scale.view(-1, 1, 1)
        return weight.unsqueeze(2).contiguous(), bias

    return derived(conv, "fold", sources, build, extra=id(norm))


def depthwise_norm_activation(conv: nn.Module, norm: nn.Module, activation: nn.Module, y: torch.Tensor,
                              padding: tuple[int, int] | None = None) -> torch.Tensor:
    """``activation(norm(conv(y)))`` for a waist ``DepthwiseConv1d`` on (B, T, C), ``padding`` (left, right)
    frames instead of ``conv.padding`` when given (0, 0 for an input that carries its own left context).

    Fast path: one oneDNN convolution reading (B, T, C) as channels-last (B, C, 1, T), so no transposes; an
    inference :class:`~oasr.layers.BatchNorm1d` ``norm`` is folded into its weights (once per weight version)
    and the activation (SiLU / ReLU) is its epilogue; any other norm (a LayerNorm) and activation run after it.
    Unequal padding runs the larger side on both and drops the extra output frames."""
    left, right = conv.padding if padding is None else padding
    if (not _fast((conv,), y, 1) or y.dim() != 3 or conv.groups != y.size(-1)
            or (left != right and conv.stride != 1)):
        if padding is None:
            return activation(norm(conv(y)))
        out = F.conv1d(F.pad(y.transpose(1, 2), (left, right)), conv.weight, conv.bias, conv.stride, 0,
                       conv.dilation, conv.groups)
        return activation(norm(out.transpose(1, 2)))
    batch_norm = isinstance(norm, BatchNorm1d)
    weight, bias = _folded_depthwise(conv, norm if batch_norm else None)
    name = getattr(activation, "name", "").lower()
    post = _POST_OPS[name][0] if batch_norm and name in _IN_PLACE else "none"
    side = max(left, right)
    out = torch.ops.mkldnn._convolution_pointwise(y.transpose(1, 2).unsqueeze(2), weight, bias, [0, side],
                                                  [1, conv.stride], [1, conv.dilation], conv.groups, post, [], "")
    out = out.squeeze(2).transpose(1, 2)
    if left != right:  # stride 1: drop the frames that read the padding only the other side has
        out = out[:, side - left:out.size(1) - (side - right)]
    if post != "none":
        return out
    if not batch_norm:
        out = norm(out)
    if name in _IN_PLACE:  # this call's own tensor
        return _IN_PLACE[name](out, inplace=True)
    return activation(out)


def conv2d_weight(conv: nn.Module, input_hint: Sequence[int]) -> torch.Tensor:
    """``conv``'s (Conv2d) weight reordered once for oneDNN's convolution
    (``torch.ops.mkldnn._convolution_pointwise`` with ``conv``'s padding, stride and groups, dilation 1);
    ``input_hint`` (N, C, H, W) is a typical input shape, for oneDNN's choice of weight layout.  Build it
    inside a :func:`~oasr.layers.derived.derived` value."""
    return torch._C._nn.mkldnn_reorder_conv2d_weight(
        conv.weight.detach().contiguous().to_mkldnn(), _pair(conv.padding), _pair(conv.stride), [1, 1], conv.groups,
        list(input_hint))


def channels_last_columns(linear: nn.Module, channels: int, cls: type[nn.Module] = Linear) -> nn.Module:
    """A ``cls`` copy of ``linear`` (no grad) whose input columns are permuted from the channel-major (C, F)
    flattening of a convolution's (C, F) output to the channels-last (F, C) one, so it reads a channels-last
    convolution output as it lies."""
    out_features, width = linear.weight.shape
    copy = cls(width, out_features, bias=linear.bias is not None).requires_grad_(False)
    copy.weight.copy_(linear.weight.detach().view(out_features, channels, width // channels).transpose(1, 2)
                      .reshape(out_features, width))
    if linear.bias is not None:
        copy.bias.copy_(linear.bias.detach())
    return copy


def _glu_halves(module: nn.Module) -> tuple[tuple[torch.Tensor, torch.Tensor | None], ...]:
    """The packed (weight, bias) of ``module``'s value half and gate half (GLU's first and second outputs)."""
    weight, bias = module.weight, module.bias

    def build():
        flat = weight.reshape(weight.size(0), -1)
        half = flat.size(0) // 2
        return tuple((torch.ops.mkldnn._reorder_linear_weight(flat[part].contiguous()),
                      None if bias is None else bias[part].contiguous())
                     for part in (slice(0, half), slice(half, None)))

    return derived(module, ("packed", "glu"), [weight, bias], build)


def glu_linear(module: nn.Module, x: torch.Tensor, *, min_rows: int = MIN_ROWS) -> torch.Tensor:
    """``glu(module(x))`` over the last dimension.  Fast path: two GEMMs over the packed halves, the gate's with
    a sigmoid epilogue, the value's multiplying by it in its epilogue (no (rows, 2·out) intermediate, no GLU
    pass; measured 1.2-1.35x faster than one GEMM and ``F.glu`` at 32-160 rows, 512 -> 2 x 512)."""
    if _fast((module,), x, min_rows) and module.weight.size(0) % 2 == 0:
        (value, value_bias), (gate, gate_bias) = _glu_halves(module)
        sigmoid = torch.ops.mkldnn._linear_pointwise(x, gate, gate_bias, "sigmoid", [], "")
        return torch.ops.mkldnn._linear_pointwise.binary(x, sigmoid, value, value_bias, "mul")
    return F.glu(linear(module, x, min_rows=min_rows), dim=-1)


def _few_rows(rows: int) -> int:
    """The padded row count of a ``blocked(few=True)`` call under :data:`MIN_ROWS` rows: the next power of two."""
    return 1 << (rows - 1).bit_length()


def blocked(fn: Callable[..., torch.Tensor], *tensors: torch.Tensor, block_rows: int = BLOCK_ROWS,
            few: bool = False) -> torch.Tensor:
    """``fn(*tensors)`` for a row-wise ``fn`` (each output row depends only on the same row of each
    input), run on the fast path over blocks of ``block_rows`` flattened rows (a shorter last one padded
    to a multiple of :data:`MIN_ROWS`), so the GEMMs inside see at most ``block_rows / MIN_ROWS`` distinct
    shapes.  ``few``: fewer than :data:`MIN_ROWS` rows are padded up to a power of two and run too
    (for an ``fn`` whose packed calls pass ``min_rows=1``; a decode step's rows)."""
    x = tensors[0]
    lead = x.shape[:-1]
    rows = x.numel() // x.size(-1) if x.dim() >= 2 else 0
    if rows == 0 or (rows < MIN_ROWS and not few) or not _fast((), x, 1):
        return fn(*tensors)
    flat = [t.reshape(rows, t.size(-1)) for t in tensors]
    outs = []
    for start in range(0, rows, block_rows):
        stop = min(start + block_rows, rows)
        parts = [t[start:stop] for t in flat]
        if stop - start == block_rows:
            pad = 0
        else:
            pad = -(stop - start) % MIN_ROWS if rows >= MIN_ROWS else _few_rows(rows) - rows
        if pad:
            parts = [F.pad(t, (0, 0, 0, pad)) for t in parts]
        out = fn(*parts)
        outs.append(out[:stop - start] if pad else out)
    out = outs[0] if len(outs) == 1 else torch.cat(outs)
    return out.reshape(*lead, out.size(-1))


def sgemm_available() -> bool:
    """Whether torch was built with MKL, whose packed sgemm :func:`sgemm` runs."""
    return torch.backends.mkl.is_available()


def _sgemm_packed(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """``module``'s (out, in) weight packed for MKL's sgemm (``cblas_sgemm_pack``), and that (out, in) weight."""
    weight = module.weight

    def build():
        flat = weight.reshape(weight.size(0), -1).contiguous()
        return torch.ops.mkl._mkl_reorder_linear_weight(flat, MIN_ROWS), flat

    return derived(module, ("packed", "sgemm"), [weight], build)


def sgemm(module: nn.Module, x: torch.Tensor, activation: str = "none", *,
          residual: torch.Tensor | None = None, scale: float = 1.0) -> torch.Tensor:
    """``activation(module(x))``, or ``residual + scale * module(x)`` when ``residual`` is given, for a waist
    :class:`~oasr.layers.Linear` or ``PointwiseConv1d``: MKL's sgemm over the weight packed once, at ``x``'s own
    row count.

    Unlike the oneDNN GEMMs above, MKL's packed sgemm keeps no per-shape state (a oneDNN primitive of M rows
    keeps an M x out scratchpad: ~2 MB at 256 rows of a 2048-wide output), so any row count runs unpadded, in one
    call; the activation and the residual add are one in-place pass over the output.  Measured on the
    FastConformer's 512 <-> 2048 shapes at 25-300 rows (one thread, Intel Xeon with AVX-512): as fast as oneDNN's
    kernel or 10-15 % faster at the same rows (docs/benchmarks.md § Parakeet, session 7).  The product equals
    ``F.linear`` (MKL's sgemm packing the weight per call) bit for bit.  Reference ops where the fast path does not
    apply (see :func:`fusable`) or torch has no MKL."""
    bias = module.bias
    if not (_fast((module,), x, 1) and sgemm_available() and activation in _POST_OPS
            and (bias is None or bias.dtype == torch.float32)
            and (residual is None or (residual.shape[:-1] == x.shape[:-1] and residual.dtype == x.dtype))):
        if residual is not None:  # the reference ops (linear_add's, taken below any row count)
            return linear_add(module, x, residual, scale=scale, min_rows=x.numel() + 1)
        return linear(module, x, activation, min_rows=x.numel() + 1)
    weight, flat = _sgemm_packed(module)
    y = torch.ops.mkl._mkl_linear(x, weight, flat, bias, x.numel() // x.size(-1))
    if residual is not None:
        if residual.shape != y.shape:  # broadcast as the reference does
            return residual + (y * scale if scale != 1.0 else y)
        return torch.add(residual, y, alpha=scale, out=y)
    if activation in _IN_PLACE:
        return _IN_PLACE[activation](y, inplace=True)
    return activation_fn(activation)(y) if activation not in ("none", "identity") else y
