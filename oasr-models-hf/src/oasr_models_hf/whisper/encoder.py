"""Whisper's audio encoder on the layer waist: two convolutions with GELU, sinusoidal positions (a stored
table), pre-norm Transformer layers, a final norm.  Module names are Hugging Face's
(``encoder.layers.N.self_attn.q_proj`` ...), so an HF state dict loads 1:1.

On the CPU fast path (:mod:`oasr.layers.packed`: fp32 linears, inference, ``OASR_KERNELS`` on) the
linears run as prepacked oneDNN GEMMs with their bias, exact GELU and residual adds fused, over one
GEMM block per 30 s window (every window runs the same shapes); the convolutions carry their GELU in
oneDNN's epilogue.  The attention core is torch's SDPA (no mask: its flash kernel, measured 2x faster
than an in-place scores/softmax core at 1500 frames); an int8 layer's is the ``int8_attention`` kernel
where oasr-kernels provides it (:attr:`WhisperEncoderLayer.int8_attention`).  On a CPU with AMX tiles an int8
layer runs at bfloat16 instead (:attr:`WhisperEncoderLayer.int8_amx`).  Everywhere else the reference ops run.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from oasr.errors import CapabilityError
from oasr.layers import (
    Conv1d,
    Embedding,
    Gelu,
    LayerNorm,
    Linear,
    LinearActivation,
    MultiHeadAttention,
    merge_heads,
    packed,
    split_heads,
)
from oasr.layers._backend import kernel
from oasr.layers.quant import amx, bf16_linear, int8_block, int8_linear_group
from oasr.models.base import BaseEncoder
from oasr_models_hf.whisper.config import WhisperConfig

#: bias of q, k, v, out: Whisper's k_proj has none
ATTN_BIAS = (True, False, True, True)


def _int8_fused(group: tuple[nn.Module, ...], x: torch.Tensor) -> bool:
    """The int8 fast path: q/k/v int8 (one fbgemm GEMM), CPU float32 inference; the layer's other
    linears take whichever path their own precision has (``packed`` falls back per module)."""
    return all(getattr(lin, "_int8", None) is not None for lin in group) and packed.fusable((), x, min_rows=1)


class WhisperEncoderLayer(nn.Module):
    #: False: an int8 layer keeps the reference ops (the A/B of ``benchmarks/whisper.py --int8-ab``)
    int8_fused = True
    #: an int8 layer's attention core on int8 too (``int8_attention`` kernel slot, oasr-kernels: q k^T and the
    #: weights times v as VNNI int8 products, ~24 against SDPA's ~43 ms per tiny.en layer and window); False, or
    #: without the kernel: the float32 core (SDPA).  Measured on tiny.en's benchmark (docs/benchmarks.md, "int8
    #: attention core"): the short set's WER 19.8 -> 19.5 % (fp32: 19.5 %), token agreement with fp32 98.4 ->
    #: 97.8 %; the long recording 14.7 -> 14.4 %, 94.7 -> 94.5 %.  Where the CPU has no VNNI the slot itself runs
    #: SDPA: oneDNN's int8 products are exact but slow there (an encoder window 8.8-9.7 s against 0.78 s on Zen 3)
    int8_attention = True
    #: an int8 layer's ``fc2`` (a float linear in the quantization layout: its GELU input has outlier channels) on
    #: the ``int8_linear`` kernel too, its activations as two int8 planes (~15 bits) and its weights int8 per output
    #: channel; False: the float32 GEMM.  Measured on tiny.en (docs/benchmarks.md, session 13): the int8 encoder
    #: ~9 % faster per window, but token agreement with fp32 95.4-97.4 % on the benchmark's 34 clips (fbgemm's path
    #: 97.8 %) and 94.1 % on test_trained's clips (the weights' rounding: fc2's weights kept as two planes too cost a
    #: third GEMM and measured no faster than float32), so off
    int8_fc2 = False
    #: an int8 layer's q/k/v, out_proj and fc1 on the ``int8_linear`` kernel (fbgemm's activation grid, oneDNN's
    #: int8 GEMM, fused passes) instead of fbgemm's GEMM and torch's scaling passes: the same function, 2.6-3.5 %
    #: faster per window, but another rounding order flips near-tie tokens: the int8 engine's agreement with fp32 on
    #: test_trained's clips 97.3 -> 95.2 % (the benchmark's 34 clips 97.8 -> 98.0 % or 96.0 % by run), so off
    int8_kernel_linears = False
    #: where the CPU multiplies bfloat16 on AMX tiles (:func:`oasr.layers.quant.amx`), an int8 layer runs at
    #: bfloat16 on oneDNN (:meth:`_forward_bf16`): every linear over its int8 weights dequantized (fc2 over its float
    #: ones) and rounded to bfloat16, the attention core SDPA at bfloat16.  On one Sapphire Rapids core a tiny.en
    #: window takes ~105 against ~295 ms on the int8 GEMMs and core, and its output is nearer float32's (rms change
    #: 0.050 against 0.071 on a random window): bfloat16 keeps 8 significant bits of every value where int8's grid
    #: spends 8 bits on a whole row (docs/benchmarks.md, session 15).  Without AMX bfloat16 is emulated and slow:
    #: the int8 paths above run
    int8_amx = True

    def __init__(self, d_model: int, heads: int, ffn_dim: int):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, heads, bias=ATTN_BIAS)
        self.self_attn_layer_norm = LayerNorm(d_model)
        self.fc1 = LinearActivation(d_model, ffn_dim, "gelu")
        self.fc2 = Linear(ffn_dim, d_model)
        self.final_layer_norm = LayerNorm(d_model)

    def forward(self, x: torch.Tensor, block_rows: int = packed.BLOCK_ROWS) -> torch.Tensor:
        """Pre-norm self-attention then MLP, each with its residual.  On the CPU fast path
        (:mod:`oasr.layers.packed`: fp32 linears, inference) q/k/v run as one prepacked GEMM, fc1's
        exact GELU and the residual adds of ``out_proj`` and ``fc2`` are GEMM epilogues, over blocks of
        ``block_rows`` frames.  With int8 q/k/v they run as one fbgemm GEMM per block with one per-row scaling
        pass (:func:`oasr.layers.quant.int8_linear_group`), out_proj and fc1 through their int8 hooks (GELU /
        residual add in place); with :attr:`int8_kernel_linears` the three on the ``int8_linear`` kernel
        (:func:`oasr.layers.quant.int8_block`: the same activation grid, oneDNN's int8 GEMM, the bias, GELU and
        residual in fused passes).  fc2 is a float linear in the layout: the packed fp32 GEMM, or with
        :attr:`int8_fc2` the kernel with two-plane activations.  A full window's int8 rounding depends on that
        window's frames only.  Otherwise
        (autograd, not the CPU, ``OASR_KERNELS=0``, a mixed q/k/v) the reference ops run."""
        sa = self.self_attn
        group = tuple(getattr(sa, name) for name in sa.names[:3])
        out_proj = getattr(sa, sa.names[3])
        if packed.fusable((*group, out_proj, self.fc1, self.fc2), x):
            project = packed.linear_group
        elif self.int8_fused and _int8_fused(group, x):
            project = int8_linear_group
        else:
            attn = sa(self.self_attn_layer_norm(x))
            normed, x = self.final_layer_norm.add_forward(attn, x)
            return x + self.fc2(self.fc1(normed))
        int8 = project is int8_linear_group
        if int8 and self.int8_amx and amx():
            return self._forward_bf16(x, block_rows)
        fused = int8 and self.int8_kernel_linears

        def qkv_rows(rows: torch.Tensor) -> torch.Tensor:
            out = int8_block(group, rows) if fused else None
            return project(group, rows) if out is None else out

        qkv = packed.blocked(qkv_rows, self.self_attn_layer_norm(x), block_rows=block_rows)
        core = kernel("int8_attention") if int8 and self.int8_attention else None
        if core is not None:
            n, frames, width = qkv.shape
            q, k, v = qkv.view(n, frames, 3, sa.n_heads, width // (3 * sa.n_heads)).unbind(2)
            out = core(q, k, v, sa.core.scale).view(n, frames, width // 3)
        else:
            q, k, v = (split_heads(t, sa.n_heads) for t in qkv.chunk(3, dim=-1))
            out = merge_heads(F.scaled_dot_product_attention(q, k, v, scale=sa.core.scale))

        def attn_out(rows: torch.Tensor, res: torch.Tensor) -> torch.Tensor:
            y = int8_block((out_proj,), rows, residual=res) if fused else None
            return packed.linear_add(out_proj, rows, res) if y is None else y

        x = packed.blocked(attn_out, out, x, block_rows=block_rows)

        def mlp(rows: torch.Tensor, res: torch.Tensor) -> torch.Tensor:
            h = int8_block((self.fc1,), rows, activation=self.fc1.activation) if fused else None
            if h is None:
                h = packed.linear(self.fc1, rows, self.fc1.activation)
            y = int8_block((self.fc2,), h, residual=res, planes=2) if int8 and self.int8_fc2 else None
            return packed.linear_add(self.fc2, h, res) if y is None else y

        return packed.blocked(mlp, self.final_layer_norm(x), x, block_rows=block_rows)

    def _forward_bf16(self, x: torch.Tensor, block_rows: int) -> torch.Tensor:
        """The layer at bfloat16 (:attr:`int8_amx`): the norms and the residual stream stay float32, each linear
        takes the normed rows rounded to bfloat16 (:func:`oasr.layers.quant.bf16_linear`: fc1's exact GELU in the
        GEMM's epilogue, its bfloat16 output fc2's input as it is), and the residual adds are float32."""
        sa = self.self_attn
        group = tuple(getattr(sa, name) for name in sa.names[:3])
        out_proj = getattr(sa, sa.names[3])
        qkv = packed.blocked(lambda rows: bf16_linear(group, rows.to(torch.bfloat16)), self.self_attn_layer_norm(x),
                             block_rows=block_rows)
        q, k, v = (split_heads(t, sa.n_heads) for t in qkv.chunk(3, dim=-1))
        out = merge_heads(F.scaled_dot_product_attention(q, k, v, scale=sa.core.scale))
        x = packed.blocked(lambda res, rows: res + bf16_linear((out_proj,), rows), x, out, block_rows=block_rows)

        def mlp(rows: torch.Tensor, res: torch.Tensor) -> torch.Tensor:
            h = bf16_linear((self.fc1,), rows.to(torch.bfloat16), self.fc1.activation)
            return res + bf16_linear((self.fc2,), h)

        return packed.blocked(mlp, self.final_layer_norm(x), x, block_rows=block_rows)


class WhisperEncoder(BaseEncoder):
    """Log-mel (B, T, n_mels) → hidden (B, T/2, d_model); T is at most one 30 s window."""

    streaming_kind = "none"
    subsampling_rate = 2

    def __init__(self, config: WhisperConfig):
        super().__init__()
        d = config.d_model
        self.conv1 = Conv1d(config.num_mel_bins, d, 3, padding=1)
        self.conv2 = Conv1d(d, d, 3, stride=2, padding=1)
        self.act = Gelu()
        self.embed_positions = Embedding(config.max_source_positions, d)
        self.layers = nn.ModuleList(
            WhisperEncoderLayer(d, config.encoder_attention_heads, config.encoder_ffn_dim)
            for _ in range(config.encoder_layers)
        )
        self.layer_norm = LayerNorm(d)
        self._d_model = d

    @property
    def output_size(self) -> int:
        return self._d_model

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        """The two convolutions with their GELU fused (:func:`oasr.layers.packed.conv1d`), positions, layers."""
        act = self.act.name
        x = packed.conv1d(self.conv2, packed.conv1d(self.conv1, feats.transpose(1, 2), act), act).transpose(1, 2)
        n_pos = self.embed_positions.num_embeddings
        if x.shape[1] > n_pos:
            raise CapabilityError(
                f"Whisper encoder input has {feats.shape[1]} frames; one window holds at most {2 * n_pos} "
                f"(30 s). Longer audio is decoded in windows by the aed strategy."
            )
        x = x + self.embed_positions.weight[: x.shape[1]].to(x.dtype)
        # a full window's frames are one GEMM block: every window runs the same shapes
        block = x.shape[1] if x.shape[1] == n_pos else packed.BLOCK_ROWS
        for layer in self.layers:
            x = layer(x, block)
        return self.layer_norm(x)


__all__ = ["ATTN_BIAS", "WhisperEncoder", "WhisperEncoderLayer"]
