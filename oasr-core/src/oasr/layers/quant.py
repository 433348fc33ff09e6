"""int8 weights for the layer waist's linears: per-output-channel symmetric int8, dynamic activations.

:func:`quantize_model_int8` turns every :class:`oasr.layers.Linear` of a model (except the layers its
:class:`~oasr.models.specs.QuantLayout` keeps at full precision) into an int8 linear:

* storage: ``weight`` becomes an int8 buffer (out, in) and ``weight_scale`` a float32 buffer (out,)
  with ``w ≈ weight * weight_scale[:, None]`` and ``weight_scale = max|w_row| / 127`` (round to
  nearest); the bias stays in floating point.  These two tensors are what a native bundle of
  ``format_version`` 2 stores, so a quantized bundle is a plain safetensors file;
* compute on CPU: fbgemm's dynamic int8 GEMM (``torch.ops.quantized.linear_dynamic`` over weights
  prepacked per channel), accumulating in int32, with **per-row** (per-token) activation scales:
  each row of the input is divided by its own max |x| before fbgemm quantizes the block to uint8
  (on a grid within [-1, 1]), and the output row is multiplied back (the bias is added after).
  One loud frame then no longer coarsens the rounding of every other frame, as one scale per
  tensor does.  A single row (an incremental decode step of one request) goes to fbgemm as it is,
  with the bias packed beside the weight: for one row the per-row scale *is* the per-tensor scale
  fbgemm picks itself (the same grid up to float rounding), and the row's scaling passes cost
  more than the one-row GEMM itself (about 24 of 39 µs for a 384 x 384 layer, measured).  With VNNI
  the activations use all 8 bits; without it they keep 7 (``reduce_range``) so fbgemm's 16-bit
  pair sums cannot saturate;
* compute on a CPU with AMX tiles (:func:`amx`): a model may run many rows at bfloat16 instead, over the int8
  weights dequantized and rounded to bfloat16 (:func:`bf16_linear`, oneDNN; Whisper's encoder layers do): there
  the bfloat16 GEMM outruns fbgemm's int8 one and rounds each value rather than each row to 8 bits;
* compute elsewhere (CUDA): the int8 weight is dequantized per call, a reference path.

A tied output projection (sharing its weight with an embedding) gets its own int8 copy; the
embedding keeps the floating-point table.

The ``quantization`` section of a bundle::

    {"scheme": "int8_per_channel_dynamic", "layers": ["decoder.layers.0.fc1", ...],
     "read_bf16": ["decoder.layers.0.fc2", ...],  # optional: float linears a kernel may read at bfloat16
     "provenance": {"tool": "oasr", "version": "..."}}

:func:`prepare_quantized` makes a freshly built model ready to receive such a bundle's state dict.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from oasr.errors import CheckpointFormatError
from oasr.layers._backend import kernel
from oasr.layers.derived import derived, forget
from oasr.layers.linear import Linear
from oasr.layers.packed import _POST_OPS

SCHEME = "int8_per_channel_dynamic"


@functools.cache
def _vnni() -> bool:
    probe = getattr(torch.cpu, "_is_vnni_supported", None)
    try:
        return bool(probe()) if probe is not None else False
    except Exception:
        return False


class Int8Weight:
    """The ``Linear._int8`` hook: ``(x, bias) -> x @ dequant(W).T + bias`` from int8 storage.

    fbgemm's packed weights are derived data kept on the hook (:func:`oasr.layers.derived.derived`), rebuilt
    when the int8 weight, its scales or the bias change (a reload, ``.to()``, an in-place edit)."""

    def __init__(self, linear: Linear):
        self.linear = linear
        self.reduce_range = not _vnni()

    def invalidate(self) -> None:
        forget(self)

    def _pack(self, bias: torch.Tensor | None):
        lin = self.linear
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch marks quantized tensor constructors as deprecated
            scales = lin.weight_scale.double()
            qweight = torch._make_per_channel_quantized_tensor(
                lin.weight.cpu(), scales.cpu(), torch.zeros_like(scales, dtype=torch.long).cpu(), 0)
            return torch.ops.quantized.linear_prepack(qweight, bias)

    def _prepacked(self):
        """fbgemm's packed weight."""
        lin = self.linear
        return derived(self, "packed", [lin.weight, lin.weight_scale], lambda: self._pack(None), differentiable=False)

    def _prepacked_with_bias(self, bias: torch.Tensor):
        """The packed weight with ``bias`` added by fbgemm (the one-row path)."""
        lin = self.linear
        return derived(self, "packed_with_bias", [lin.weight, lin.weight_scale, bias],
                       lambda: self._pack(bias.detach().float().contiguous()), differentiable=False)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        lin = self.linear
        if _fbgemm(x):
            rows = x.float().reshape(-1, x.shape[-1])
            if rows.shape[0] == 1:  # the row's own scale is fbgemm's per-tensor scale
                packed = self._prepacked() if bias is None else self._prepacked_with_bias(bias)
                out = torch.ops.quantized.linear_dynamic(rows, packed, self.reduce_range)
            else:
                # an all-zero row stays zero under any positive scale
                scale = rows.abs().amax(dim=1, keepdim=True).clamp_min_(torch.finfo(torch.float32).tiny)
                # fbgemm's uint8 grid spans the block's [min, max] (within [-1, 1] after the row scaling)
                out = torch.ops.quantized.linear_dynamic(rows / scale, self._prepacked(), self.reduce_range)
                out.mul_(scale)
                if bias is not None:
                    out.add_(bias.float())
            return out.reshape(*x.shape[:-1], out.shape[-1]).to(x.dtype)
        weight = lin.weight.to(x.dtype) * lin.weight_scale.to(x.dtype)[:, None]
        return F.linear(x, weight, bias)


@functools.cache
def _has_fbgemm() -> bool:
    # the engine list is built anew on every read (~5-13 us, once per int8 call at one row)
    return "fbgemm" in torch.backends.quantized.supported_engines


def _fbgemm(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and _has_fbgemm()


def _group_pack(linears: tuple[Linear, ...]) -> tuple[Any, torch.Tensor | None]:
    """fbgemm's packed ``cat(weights)`` (per output channel) and ``cat(biases)`` of int8 ``linears``,
    kept on the first one's hook and rebuilt when any member's tensors change."""

    def build() -> tuple[Any, torch.Tensor | None]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch marks quantized tensor constructors as deprecated
            scales = torch.cat([lin.weight_scale for lin in linears]).double().cpu()
            qweight = torch._make_per_channel_quantized_tensor(
                torch.cat([lin.weight for lin in linears]).cpu(), scales, torch.zeros_like(scales, dtype=torch.long),
                0)
            packed = torch.ops.quantized.linear_prepack(qweight, None)
        if all(lin.bias is None for lin in linears):
            return packed, None
        return packed, torch.cat([lin.bias.detach().float() if lin.bias is not None
                                  else lin.weight_scale.new_zeros(lin.out_features) for lin in linears])

    return derived(linears[0]._int8, ("group", *(id(lin) for lin in linears)),
                   [t for lin in linears for t in (lin.weight, lin.weight_scale, lin.bias)], build, differentiable=False)


def int8_linear_group(linears, x: torch.Tensor) -> torch.Tensor:
    """``cat([lin(x) for lin in linears], -1)`` for int8 waist linears sharing one input (e.g. q, k, v):
    one fbgemm GEMM over the concatenated weights, the input's per-row scaling done once.  The same
    numbers as the separate calls (one input block quantized once; int32 accumulation is exact)."""
    linears = tuple(linears)
    if not all(getattr(lin, "_int8", None) is not None for lin in linears) or not _fbgemm(x) or len(linears) < 2:
        return torch.cat([lin(x) for lin in linears], dim=-1)
    hook: Int8Weight = linears[0]._int8
    rows = x.float().reshape(-1, x.shape[-1])
    packed, bias = _group_pack(linears)
    scale = rows.abs().amax(dim=1, keepdim=True).clamp_min_(torch.finfo(torch.float32).tiny)
    out = torch.ops.quantized.linear_dynamic(rows / scale, packed, hook.reduce_range)
    out.mul_(scale)
    if bias is not None:
        out.add_(bias)
    return out.reshape(*x.shape[:-1], out.shape[-1]).to(x.dtype)


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight`` (out, in) as per-output-channel symmetric int8 and its float32 scales (round to nearest)."""
    w = weight.detach().float()
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    return torch.clamp(torch.round(w / scale[:, None]), -127, 127).to(torch.int8), scale.float()


def _block_weights(linears: tuple[Linear, ...]) -> tuple[torch.Tensor, ...]:
    """The ``int8_linear`` kernel's operands for ``linears`` sharing one input: ``cat`` of their int8 weights (a float
    linear's quantized per output channel here, on first use), scales, the weights' row sums (int32) and biases; kept
    on the first linear and rebuilt when any member's tensors change."""

    def build():
        parts = [(lin.weight, lin.weight_scale) if lin._int8 is not None else quantize_rows(lin.weight)
                 for lin in linears]
        weight = parts[0][0].contiguous() if len(parts) == 1 else torch.cat([q for q, _ in parts])  # one: no copy
        bias = None
        if any(lin.bias is not None for lin in linears):
            bias = torch.cat([lin.bias.detach().float() if lin.bias is not None
                              else lin.weight.new_zeros(lin.out_features, dtype=torch.float32) for lin in linears])
        return weight, torch.cat([s for _, s in parts]).float().contiguous(), weight.sum(1, dtype=torch.int32), bias

    return derived(linears[0], ("int8_block", *(id(lin) for lin in linears)),
                   [t for lin in linears for t in (lin.weight, getattr(lin, "weight_scale", None), lin.bias)], build,
                   differentiable=False)


def int8_block(linears, x: torch.Tensor, *, residual: torch.Tensor | None = None, planes: int = 1,
               activation: str = "none") -> torch.Tensor | None:
    """``cat([lin(x) for lin in linears], -1)`` (+ ``residual``) for a block of rows through the ``int8_linear`` kernel
    (oasr-kernels: one oneDNN int8 GEMM between a quantizing and a dequantizing numba pass), or None where it does not
    apply (no kernel or no CPU ``torch._int_mm``, autograd, not CPU float32, fewer than 17 rows, widths not multiples
    of 8, a machine without VNNI).  ``planes`` 1: int8 linears, the activations on fbgemm's dynamic grid (the numbers
    of :class:`Int8Weight`'s block path up to float rounding); 2: the activations as two int8 planes of each row
    (~15 bits), the weights int8 (a float linear's quantized per output channel on first use).  ``activation``: "gelu"
    (exact, on the output in place; one plane, no residual) where the kernel offers it, else None."""
    linears = tuple(linears)
    fn = kernel("int8_linear")
    rows = x.numel() // x.shape[-1] if x.dim() >= 2 else 0
    if (fn is None or not x.is_cpu or x.dtype != torch.float32 or torch.is_grad_enabled() or rows <= 16
            or x.shape[-1] % 8 or sum(lin.out_features for lin in linears) % 8 or not _vnni()
            or (planes == 1 and not all(lin._int8 is not None for lin in linears))):
        return None
    weight, scale, sums, bias = _block_weights(linears)
    flat = x.reshape(rows, x.shape[-1]).contiguous()
    res = None if residual is None else residual.reshape(rows, -1).float().contiguous()
    out = fn(flat, weight, scale, sums, bias, res, planes, activation)
    return None if out is None else out.view(*x.shape[:-1], out.shape[-1])


@functools.cache
def amx() -> bool:
    """Whether this CPU multiplies bfloat16 on AMX tiles (torch's probe), where oneDNN's bfloat16 GEMM runs ~10x
    float32's rate (1500 x 384 -> 1536: 1.9 against 20 ms on one Sapphire Rapids core) and outruns fbgemm's int8."""
    probe = getattr(torch.cpu, "_is_amx_tile_supported", None)
    try:
        return bool(probe()) and torch.backends.mkldnn.is_available() if probe is not None else False
    except Exception:
        return False


def _bf16_weights(linears: tuple[Linear, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """oneDNN's packed bfloat16 ``cat`` of ``linears``' weights (an int8 linear's dequantized per output channel, a
    float one's as stored, each rounded to nearest) and the bfloat16 ``cat`` of their biases; kept on the first
    linear and rebuilt when any member's tensors change."""

    def build():
        weights = [lin.weight.float() * lin.weight_scale[:, None] if getattr(lin, "_int8", None) is not None
                   else lin.weight.detach().float() for lin in linears]
        weight = torch.cat(weights).to(torch.bfloat16).contiguous()
        bias = None
        if any(lin.bias is not None for lin in linears):
            bias = torch.cat([lin.bias.detach().float() if lin.bias is not None else w.new_zeros(w.shape[0])
                              for lin, w in zip(linears, weights, strict=True)]).to(torch.bfloat16)
        return torch.ops.mkldnn._reorder_linear_weight(weight), bias

    return derived(linears[0], ("bf16", *(id(lin) for lin in linears)),
                   [t for lin in linears for t in (lin.weight, getattr(lin, "weight_scale", None), lin.bias)], build,
                   differentiable=False)


def bf16_linear(linears, x: torch.Tensor, activation: str = "none") -> torch.Tensor:
    """``activation(cat([lin(x) for lin in linears], -1))`` at bfloat16 for a CPU bfloat16 ``x``: one oneDNN GEMM
    over the linears' weights rounded to bfloat16 (int8 ones dequantized first), float32 sums, the bias and
    ``activation`` (a name of the packed waist's oneDNN post-ops, e.g. "gelu", exact) in its epilogue, a bfloat16
    result.  On an :func:`amx` CPU this is the fast way through many rows; elsewhere bfloat16 is emulated and slow,
    so callers ask :func:`amx` first."""
    weight, bias = _bf16_weights(tuple(linears))
    attr, algorithm = _POST_OPS[activation]
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, attr, [], algorithm)


def _int8_storage(linear: Linear, weight: torch.Tensor | None) -> None:
    """Give ``linear`` int8 ``weight`` / fp32 ``weight_scale`` buffers (from ``weight`` if given)."""
    out_f, in_f = linear.out_features, linear.in_features
    if weight is not None:
        q, scale = quantize_rows(weight)
    else:
        device = linear.weight.device
        q = torch.zeros(out_f, in_f, dtype=torch.int8, device=device)
        scale = torch.ones(out_f, dtype=torch.float32, device=device)
    del linear.weight  # the parameter (possibly shared with an embedding) leaves this module only
    linear.register_buffer("weight", q.contiguous())
    linear.register_buffer("weight_scale", scale.float().contiguous())
    hook = Int8Weight(linear)
    linear._int8 = hook
    # load_state_dict copies into the same storage: the packed copy must be rebuilt
    linear.register_load_state_dict_post_hook(lambda module, incompatible: hook.invalidate())


def _kept(name: str, keep: tuple[str, ...]) -> bool:
    return any(name == k or name.startswith(k + ".") for k in keep)


def quantize_model_int8(model: nn.Module, layout: Any = None) -> dict[str, Any]:
    """Quantize every waist :class:`Linear` of ``model`` in place; returns the bundle's quantization section.

    ``layout`` is the model's :class:`~oasr.models.specs.QuantLayout` (default:
    ``model.quantization_layout()``); its ``keep_full_precision`` names stay floating point, and of those its
    ``read_bf16`` names are marked ``read_bf16`` (a kernel may read them as a bfloat16 copy).
    """
    if layout is None:
        layout = model.quantization_layout() if hasattr(model, "quantization_layout") else None
    keep = tuple(getattr(layout, "keep_full_precision", ()) or ())
    halves = tuple(getattr(layout, "read_bf16", ()) or ())
    names, read_bf16 = [], []
    with torch.no_grad():
        for name, module in model.named_modules():
            if not isinstance(module, Linear) or module._int8 is not None:
                continue
            if not _kept(name, keep):
                _int8_storage(module, module.weight)
                names.append(name)
            elif _kept(name, halves):
                module.read_bf16 = True
                read_bf16.append(name)
    from oasr import __version__

    section = {"scheme": SCHEME, "layers": names, "provenance": {"tool": "oasr", "version": __version__}}
    if read_bf16:
        section["read_bf16"] = read_bf16
    return section


def prepare_quantized(model: nn.Module, quant: dict[str, Any]) -> None:
    """Give the layers a bundle's ``quantization`` section lists int8 storage, ready for ``load_state_dict``."""
    if not isinstance(quant, dict) or quant.get("scheme") != SCHEME:
        scheme = quant.get("scheme") if isinstance(quant, dict) else quant
        raise CheckpointFormatError(f"quantization scheme {scheme!r} is not supported; this OASR reads {SCHEME!r}")
    modules = dict(model.named_modules())
    for name in quant.get("layers", []):
        module = modules.get(name)
        if not isinstance(module, Linear):
            raise CheckpointFormatError(
                f"the bundle's quantization section names {name!r}, which is not a linear layer of "
                f"{type(model).__name__}")
        if module._int8 is None:
            _int8_storage(module, None)
    for name in quant.get("read_bf16", []):
        module = modules.get(name)
        if not isinstance(module, Linear) or module._int8 is not None:
            raise CheckpointFormatError(
                f"the bundle's quantization section reads {name!r} at bfloat16, which is not a float linear layer of "
                f"{type(model).__name__}")
        module.read_bf16 = True


def is_quantized(module: nn.Module) -> bool:
    return any(isinstance(m, Linear) and m._int8 is not None for m in module.modules())
