"""FunASR's SANM encoder: self-attention with an FSMN memory block, over LFR features.

Per block (pre-norm, LayerNorm eps 1e-12 — ESPnet's convention, where PyTorch's 1e-5 breaks parity;
SenseVoice's copy of the encoder does use 1e-5):
``x + attn(norm1(x)) + fsmn(v)`` then ``x + ffn(norm2(x))``, where the FSMN memory is a depthwise
convolution over the (masked) value projection plus that value.  The first block maps the LFR input
width (560) to ``output_size`` and so has no residual around its attention.  Before the blocks the
input is scaled by ``sqrt(output_size)`` and FunASR's sinusoidal positions (positions from 1, sin
half then cos half) are added at the input width.

CMVN (``am.mvn``: ``(x + shift) * scale``) runs first, from the ``cmvn_shift`` / ``cmvn_scale``
buffers the converter fills, so a native bundle carries it with the weights.
"""

from __future__ import annotations

import torch
from torch import nn

from oasr import layers
from oasr.models import BaseEncoder
from oasr_models_funasr.config import SANMEncoderConfig

#: ESPnet/FunASR LayerNorm epsilon
NORM_EPS = 1e-12


def funasr_positions(length: int, dim: int, device: torch.device) -> torch.Tensor:
    """FunASR's ``SinusoidalPositionEncoder`` table for positions 1..length: (length, dim) float32."""
    positions = torch.arange(1, length + 1, device=device, dtype=torch.float32)
    increment = torch.log(torch.tensor([10000.0], device=device)) / (dim / 2 - 1)
    inv = torch.exp(torch.arange(dim / 2, device=device).float() * -increment)
    scaled = positions[:, None] * inv[None, :]
    return torch.cat([torch.sin(scaled), torch.cos(scaled)], dim=1)


def length_mask(lengths: torch.Tensor, steps: int) -> torch.Tensor:
    """(B,) lengths → (B, T, 1) float mask."""
    return (torch.arange(steps, device=lengths.device)[None, :] < lengths[:, None]).float()[..., None]


class Fsmn(nn.Module):
    """The FSMN memory: ``(conv(x * mask) + x * mask) * mask`` with a depthwise, bias-free kernel."""

    def __init__(self, channels: int, kernel_size: int, shift: int = 0):
        super().__init__()
        left = (kernel_size - 1) // 2 + max(shift, 0)
        self.fsmn_block = layers.DepthwiseConv1d(channels, kernel_size, padding=(left, kernel_size - 1 - left),
                                                 bias=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x * mask
        return (self.fsmn_block(x) + x) * mask


class SANMAttention(nn.Module):
    """``MultiHeadedAttentionSANM``: fused ``linear_q_k_v``, attention core, ``linear_out``, FSMN memory."""

    def __init__(self, in_size: int, size: int, heads: int, kernel_size: int, shift: int):
        super().__init__()
        self.size, self.heads = size, heads
        self.linear_q_k_v = layers.Linear(in_size, 3 * size)
        self.linear_out = layers.Linear(size, size)
        self.core = layers.Attention(heads, size // heads)
        self.fsmn = Fsmn(size, kernel_size, shift)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        q, k, v = self.linear_q_k_v(x).split(self.size, dim=-1)
        memory = self.fsmn(v, mask)
        heads = [layers.split_heads(t, self.heads) for t in (q, k, v)]
        attended = self.core(*heads, key_lengths=lengths)
        return self.linear_out(layers.merge_heads(attended)) + memory


class SANMEncoderLayer(nn.Module):
    def __init__(self, in_size: int, size: int, config: SANMEncoderConfig):
        super().__init__()
        self.residual_attention = in_size == size
        self.self_attn = SANMAttention(in_size, size, config.attention_heads, config.kernel_size, config.sanm_shfit)
        self.feed_forward = layers.FeedForward(size, config.linear_units, "relu", names=("w_1", "w_2"))
        self.norm1 = layers.LayerNorm(in_size, eps=config.norm_eps)
        self.norm2 = layers.LayerNorm(size, eps=config.norm_eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        attended = self.self_attn(self.norm1(x), mask, lengths)
        if self.residual_attention:
            normed, x = self.norm2.add_forward(attended, x)
        else:
            x = attended
            normed = self.norm2(x)
        return x + self.feed_forward(normed)


class SANMEncoder(BaseEncoder):
    """``encoders0`` (input width → d), ``encoders`` (``num_blocks - 1``), ``after_norm``, and for
    SenseVoice ``tp_encoders`` + ``tp_norm``.  Keys are FunASR's."""

    streaming_kind = "none"

    def __init__(self, config: SANMEncoderConfig):
        super().__init__()
        self.config = config
        d = config.output_size
        if config.cmvn:
            self.register_buffer("cmvn_shift", torch.zeros(config.input_size))
            self.register_buffer("cmvn_scale", torch.ones(config.input_size))
        self.encoders0 = nn.ModuleList([SANMEncoderLayer(config.input_size, d, config)])
        self.encoders = nn.ModuleList([SANMEncoderLayer(d, d, config) for _ in range(config.num_blocks - 1)])
        self.after_norm = layers.LayerNorm(d, eps=config.norm_eps)
        self.tp_encoders = nn.ModuleList([SANMEncoderLayer(d, d, config) for _ in range(config.tp_blocks)])
        self.tp_norm = layers.LayerNorm(d, eps=config.norm_eps) if config.tp_norm else None

    @property
    def output_size(self) -> int:
        return self.config.output_size

    def normalize(self, feats: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """CMVN of (B, T, input_size) LFR features; padded frames stay 0."""
        if not self.config.cmvn:
            return feats
        return (feats + self.cmvn_shift) * self.cmvn_scale * length_mask(lengths, feats.shape[1])

    def forward(self, feats: torch.Tensor, lengths: torch.Tensor, *,
                prefix: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T, input_size) LFR features (before CMVN) → (B, T', d), lengths.

        ``prefix`` (B, P, input_size) is prepended after CMVN (SenseVoice's query embeddings), and
        every row's length grows by P.
        """
        x = self.normalize(feats, lengths)
        if prefix is not None:
            x = self._prepend(prefix, x, lengths)
            lengths = lengths + prefix.shape[1]
        x = x * self.config.output_size ** 0.5
        x = x + funasr_positions(x.shape[1], x.shape[2], x.device).to(x.dtype)
        mask = length_mask(lengths, x.shape[1])
        for layer in self.encoders0:
            x = layer(x, mask, lengths)
        for layer in self.encoders:
            x = layer(x, mask, lengths)
        x = self.after_norm(x)
        for layer in self.tp_encoders:
            x = layer(x, mask, lengths)
        if self.tp_norm is not None:
            x = self.tp_norm(x)
        return x, lengths

    @staticmethod
    def _prepend(prefix: torch.Tensor, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``prefix`` rows, then each row's own frames: padded rows stay contiguous from frame 0."""
        return torch.cat([prefix.to(x.dtype), x], dim=1)
