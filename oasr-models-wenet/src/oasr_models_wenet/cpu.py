"""CPU fp32 inference paths of the Conformer beside :mod:`oasr.layers.packed`'s GEMMs.

Each function here computes what the module's reference ops compute, up to float rounding, and is
taken only where :func:`oasr.layers.packed.fusable` allows the packed path (CPU, float32, no autograd,
not tracing, oneDNN built in, ``OASR_KERNELS`` not off); the callers run the reference ops elsewhere.
Measured against onnxruntime on the WeNet-sized model in ``benchmarks/wenet.py`` (docs/benchmarks.md
§ WeNet, "session 5").

Derived weights (oneDNN-reordered convolution weights, a permuted projection) are kept beside their
module by :func:`oasr.layers.derived.derived`, so ``load_state_dict`` or an in-place edit rebuilds them
on the next call (the depthwise convolution's folded batch norm likewise, in core's packed path).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.utils import _pair

from oasr import layers
from oasr.layers import packed
from oasr.layers.derived import derived

#: the subsampling runs over time tiles of (batch rows × output frames) ≈ this many, so the d-channel
#: intermediate of its convolutions stays in cache; each tile is projected at once (measured at batch
#: 1, 2 and 8 against 64-512: 256 was best or within 2 % of best)
PACKED_TILE_ROWS = 256
#: the feed-forwards' GEMMs run over row blocks of this many (the last padded to a multiple of
#: ``packed.MIN_ROWS``, so oneDNN sees at most 16 shapes per GEMM): measured 3.5-7.6 % faster than
#: ``packed.BLOCK_ROWS`` (512) for a 2280-row FFN at d 256 <-> 2048, one thread (the 2 MB weights are
#: streamed half as often)
FFN_BLOCK_ROWS = 1024

# -- subsampling ----------------------------------------------------------------------------------------
def _convs(sub: nn.Module) -> list[layers.Conv2d]:
    return [m for m in sub.conv if isinstance(m, layers.Conv2d)]


def subsampling_fusable(sub: nn.Module, x: torch.Tensor) -> bool:
    """Whether ``sub`` (a ``Conv2dSubsampling``) takes :func:`subsampling_forward` on ``x``."""
    convs = _convs(sub)
    return (packed.fusable((*convs, sub.out), x)
            and all(_pair(m.padding) == (0, 0) and m.groups == 1 for m in convs))


def _subsampling_weights(sub: nn.Module) -> tuple[list[tuple[torch.Tensor, torch.Tensor | None]], layers.Linear]:
    """The conv weights reordered for oneDNN, and ``out`` with its input columns permuted from WeNet's
    (channel, frequency) flattening to the channels-last (frequency, channel) one."""
    convs = _convs(sub)

    def build():
        weights = [(packed.conv2d_weight(conv, [1, channels, 64, freq]),
                    None if conv.bias is None else conv.bias.detach())
                   for conv, (channels, freq) in zip(convs, sub.conv_inputs, strict=True)]
        return weights, packed.channels_last_columns(sub.out, convs[-1].out_channels)

    return derived(sub, "subsampling", [t for m in (*convs, sub.out) for t in (m.weight, m.bias)], build)


def subsampling_forward(sub: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``sub(x)``, (B, T, F) → (B, T', d) scaled by √d: the convolutions as oneDNN convolutions on
    reordered weights with the ReLU in their epilogue, channels-last, over time tiles of about
    ``PACKED_TILE_ROWS / B`` output frames (each reading exactly the input frames its outputs see), each
    tile projected at once — no (B, C, T, F) → (B, T, C·F) transpose copy."""
    weights, out = _subsampling_weights(sub)
    rows = x.size(0)
    frames = int(sub.output_lengths(torch.tensor(x.size(1))))
    tile = max(1, PACKED_TILE_ROWS // rows)
    rate, span = sub.subsampling_rate, sub.right_context + 1
    strides = [list(_pair(m.stride)) for m in _convs(sub)]
    x = x.unsqueeze(1)
    outs = []
    for a in range(0, frames, tile):
        y = x[:, :, a * rate:a * rate + rate * (min(tile, frames - a) - 1) + span]
        for (weight, bias), stride in zip(weights, strides, strict=True):
            y = torch.ops.mkldnn._convolution_pointwise(y, weight, bias, [0, 0], stride, [1, 1], 1, "relu", [], "")
        y = y.permute(0, 2, 3, 1)
        y = y.reshape(rows, y.size(1), -1)
        outs.append(packed.blocked(lambda r: packed.linear(out, r, scale=sub.xscale), y))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)


# -- convolution module -----------------------------------------------------------------------------------
def depthwise_norm_activation(module: nn.Module, y: torch.Tensor) -> torch.Tensor:
    """``activation(norm(depthwise_conv(y)))`` of a ``ConvolutionModule`` on (B, T, C): core's channels-last
    depthwise convolution with a batch norm folded in and the activation as its epilogue
    (:func:`oasr.layers.packed.depthwise_norm_activation`)."""
    return packed.depthwise_norm_activation(module.depthwise_conv, module.norm, module.activation, y)


# -- feed-forward -----------------------------------------------------------------------------------------
def feed_forward_blocks(block: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], linears: Sequence[nn.Module],
                        x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """``block(x, residual)`` for a row-wise ``block`` over row blocks of :data:`FFN_BLOCK_ROWS` (the last
    zero-padded to a multiple of ``packed.MIN_ROWS``); up to ``packed.BLOCK_ROWS`` rows, or off the fast
    path, :func:`oasr.layers.packed.blocked`."""
    total = x.numel() // x.size(-1)
    if total <= packed.BLOCK_ROWS or not packed.fusable(linears, x):
        return packed.blocked(block, x, residual)
    flat, flat_res = x.reshape(total, x.size(-1)), residual.reshape(total, residual.size(-1))
    outs = []
    for start in range(0, total, FFN_BLOCK_ROWS):
        stop = min(start + FFN_BLOCK_ROWS, total)
        rows, res = flat[start:stop], flat_res[start:stop]
        pad = -(stop - start) % packed.MIN_ROWS
        if pad:
            rows, res = (F.pad(t, (0, 0, 0, pad)) for t in (rows, res))
        out = block(rows, res)
        outs.append(out[:stop - start] if pad else out)
    return torch.cat(outs).reshape(residual.shape)
