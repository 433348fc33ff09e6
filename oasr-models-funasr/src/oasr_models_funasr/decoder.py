"""FunASR's ``ParaformerSANMDecoder``: one non-autoregressive pass over the CIF acoustic embeddings.

A block runs its feed-forward first (``w_2(norm(relu(w_1(norm1(x)))))``, no residual of its own), then
an FSMN-only self-attention over that output with the block input as residual, then (in the first
``att_layer_num`` blocks) cross-attention to the encoder output.  The last block (``decoders3``) is
the feed-forward alone, without residual.  Cross-attention takes the encoder lengths, not a mask.
"""

from __future__ import annotations

import torch
from torch import nn

from oasr import layers
from oasr_models_funasr.config import SANMDecoderConfig
from oasr_models_funasr.encoder import NORM_EPS, Fsmn, length_mask


class DecoderFeedForward(nn.Module):
    """``PositionwiseFeedForwardDecoderSANM``: ``w_2(norm(relu(w_1(x))))``, ``w_2`` without bias."""

    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.w_1 = layers.LinearActivation(d_model, hidden, "relu")
        self.norm = layers.LayerNorm(hidden, eps=NORM_EPS)
        self.w_2 = layers.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_2(self.norm(self.w_1(x)))


class CrossAttention(nn.Module):
    """``MultiHeadedAttentionCrossAtt``: ``linear_q``, fused ``linear_k_v``, ``linear_out``."""

    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.d_model, self.heads = d_model, heads
        self.linear_q = layers.Linear(d_model, d_model)
        self.linear_k_v = layers.Linear(d_model, 2 * d_model)
        self.linear_out = layers.Linear(d_model, d_model)
        self.core = layers.Attention(heads, d_model // heads)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, memory_lens: torch.Tensor) -> torch.Tensor:
        k, v = self.linear_k_v(memory).split(self.d_model, dim=-1)
        q = layers.split_heads(self.linear_q(x), self.heads)
        attended = self.core(q, layers.split_heads(k, self.heads), layers.split_heads(v, self.heads),
                             key_lengths=memory_lens)
        return self.linear_out(layers.merge_heads(attended))


class DecoderSelfAttention(nn.Module):
    """``MultiHeadedAttentionSANMDecoder``: the FSMN memory alone (no attention weights)."""

    def __init__(self, d_model: int, kernel_size: int, shift: int):
        super().__init__()
        self.fsmn = Fsmn(d_model, kernel_size, shift)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.fsmn(x, mask)


class DecoderLayer(nn.Module):
    def __init__(self, config: SANMDecoderConfig, *, self_attn: bool, src_attn: bool, shift: int):
        super().__init__()
        d = config.d_model
        self.feed_forward = DecoderFeedForward(d, config.linear_units)
        self.norm1 = layers.LayerNorm(d, eps=NORM_EPS)
        self.self_attn = DecoderSelfAttention(d, config.kernel_size, shift) if self_attn else None
        if self_attn:
            self.norm2 = layers.LayerNorm(d, eps=NORM_EPS)
        self.src_attn = CrossAttention(d, config.attention_heads) if src_attn else None
        if src_attn:
            self.norm3 = layers.LayerNorm(d, eps=NORM_EPS)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, memory: torch.Tensor,
                memory_lens: torch.Tensor) -> torch.Tensor:
        residual = x
        out = self.feed_forward(self.norm1(x))
        if self.self_attn is not None:
            out = residual + self.self_attn(self.norm2(out), mask)
        if self.src_attn is not None:
            out = out + self.src_attn(self.norm3(out), memory, memory_lens)
        return out


class ParaformerDecoder(nn.Module):
    """``decoders`` (self + cross), ``decoders2`` (self only), ``decoders3`` (FFN only), ``after_norm``,
    ``output_layer``.  FunASR's unused input ``embed`` is not built (the converter drops it)."""

    def __init__(self, config: SANMDecoderConfig):
        super().__init__()
        self.config = config
        shift = config.sanm_shfit
        self.decoders = nn.ModuleList([DecoderLayer(config, self_attn=True, src_attn=True, shift=shift)
                                       for _ in range(config.att_layer_num)])
        extra = config.num_blocks - config.att_layer_num
        self.decoders2 = nn.ModuleList([DecoderLayer(config, self_attn=True, src_attn=False, shift=0)
                                        for _ in range(max(extra, 0))])
        self.decoders3 = nn.ModuleList([DecoderLayer(config, self_attn=False, src_attn=False, shift=0)])
        self.after_norm = layers.LayerNorm(config.d_model, eps=NORM_EPS)
        self.output_layer = layers.Linear(config.d_model, config.vocab_size)

    def forward(self, memory: torch.Tensor, memory_lens: torch.Tensor, embeds: torch.Tensor,
                token_lens: torch.Tensor) -> torch.Tensor:
        """Encoder output (B, T, D) + lengths, acoustic embeddings (B, N, D) + token counts → log-probs (B, N, V)."""
        mask = length_mask(token_lens, embeds.shape[1])
        x = embeds
        for layer in (*self.decoders, *self.decoders2, *self.decoders3):
            x = layer(x, mask, memory, memory_lens)
        return torch.log_softmax(self.output_layer(self.after_norm(x)), dim=-1)
