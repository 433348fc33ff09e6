"""MedASR (Hugging Face ``lasr_ctc``) on the layer waist: a Conformer-CTC with RoPE and scaled residuals.

Module names are transformers' (``encoder.subsampler.dense_0``, ``encoder.layers.N.feed_forward1.linear1``,
``ctc_head`` ...), so an HF state dict loads 1:1; the one layout change is the CTC head, a kernel-size-1
``Conv1d`` upstream (weight (V, D, 1)) and a :class:`~oasr.layers.CtcProjection` here (weight (V, D)).

The forward map (seed 003), with the choices that differ from a textbook Conformer:

- subsampling: ``dense_0`` → ReLU → Conv1d(k=5, s=2) → ReLU → Conv1d(k=5, s=2) → ReLU → ``dense_1``; no
  padding, so ``T' = ((T - 5) // 2 + 1 - 5) // 2 + 1`` and a valid output frame reads valid input only;
- each block: ``x = 1.5 x + 0.5 FF1(LN(x))``; ``x = x + MHSA(LN(x))`` with NeoX RoPE on q and k (theta
  10 000) and padded keys masked; ``x = 2.0 x + Conv(LN(x))``; ``x = 1.5 x + 0.5 FF2(LN(x))``; ``LN``;
- the convolution module: pointwise (2D) → GLU → padded frames zeroed → depthwise conv with torch's
  ``"same"`` padding, which for an even kernel is 15 frames left and 16 right at k = 32 → BatchNorm →
  SiLU → pointwise;
- every LayerNorm is bias-free with eps 1e-6; the encoder ends with ``out_norm``.
"""

from __future__ import annotations

import torch
from torch import nn

from oasr.layers import (
    BatchNorm1d,
    Conv1d,
    DepthwiseConv1d,
    FeedForward,
    Glu,
    LayerNorm,
    Linear,
    LinearActivation,
    MultiHeadAttention,
    PointwiseConv1d,
    Relu,
    RotaryEmbedding,
    Swish,
    merge_heads,
)
from oasr.models.base import BaseAsrModel, BaseEncoder
from oasr.models.specs import QuantLayout, SmoothGroup
from oasr_models_hf.fastconformer.predictor import CtcHead
from oasr_models_hf.lasr.config import LasrConfig

_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")


def same_padding(kernel_size: int) -> tuple[int, int]:
    """torch's ``padding="same"`` split for stride 1: the extra frame of an even kernel goes right."""
    total = kernel_size - 1
    return total // 2, total - total // 2


class LasrSubsampling(nn.Module):
    def __init__(self, config: LasrConfig):
        super().__init__()
        h, c = config.hidden_size, config.subsampling_conv_channels
        k, s = config.subsampling_conv_kernel_size, config.subsampling_conv_stride
        self.dense_0 = LinearActivation(config.num_mel_bins, h, "relu")
        self.conv_0 = Conv1d(h, h, k, stride=s)
        self.conv_1 = Conv1d(h, c, k, stride=s)
        self.dense_1 = Linear(c, h)
        self.act_fn = Relu()

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        x = self.dense_0(feats).transpose(1, 2)
        x = self.act_fn(self.conv_1.forward_bct(self.act_fn(self.conv_0.forward_bct(x))))
        return self.dense_1(x.transpose(1, 2))

    def output_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        return self.conv_1.output_length(self.conv_0.output_length(lengths)).clamp_min(0)


class LasrConvolutionModule(nn.Module):
    def __init__(self, config: LasrConfig):
        super().__init__()
        h, bias = config.hidden_size, config.convolution_bias
        self.pointwise_conv1 = PointwiseConv1d(h, 2 * h, bias=bias)
        self.glu = Glu(dim=-1)
        self.depthwise_conv = DepthwiseConv1d(h, config.conv_kernel_size, padding=same_padding(config.conv_kernel_size),
                                              bias=bias)
        self.norm = BatchNorm1d(h, eps=config.batch_norm_eps)
        self.activation = Swish()
        self.pointwise_conv2 = PointwiseConv1d(h, h, bias=bias)

    def forward(self, x: torch.Tensor, pad: torch.Tensor | None) -> torch.Tensor:
        x = self.glu(self.pointwise_conv1(x))
        if pad is not None:
            x = x.masked_fill(pad[..., None], 0.0)
        x = self.activation(self.norm(self.depthwise_conv(x)))
        return self.pointwise_conv2(x)


class LasrBlock(nn.Module):
    def __init__(self, config: LasrConfig):
        super().__init__()
        h, eps = config.hidden_size, config.layer_norm_eps
        ff = dict(activation="silu", names=("linear1", "linear2"), bias=config.attention_bias)
        self.feed_forward1 = FeedForward(h, config.intermediate_size, **ff)
        self.self_attn = MultiHeadAttention(h, config.num_attention_heads, names=_PROJECTIONS,
                                            bias=(config.attention_bias,) * 4)
        self.conv = LasrConvolutionModule(config)
        self.feed_forward2 = FeedForward(h, config.intermediate_size, **ff)
        for name in ("norm_feed_forward1", "norm_self_att", "norm_conv", "norm_feed_forward2", "norm_out"):
            setattr(self, name, LayerNorm(h, eps=eps, bias=False))
        self.ff_weights = config.feed_forward_residual_weights
        self.conv_weights = config.conv_residual_weights

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary: RotaryEmbedding,
                lengths: torch.Tensor | None, pad: torch.Tensor | None) -> torch.Tensor:
        (a, b), (c, d) = self.ff_weights, self.conv_weights
        x = a * x + b * self.feed_forward1(self.norm_feed_forward1(x))
        attn = self.self_attn
        h = self.norm_self_att(x)
        q, k, v = attn.project(h, 0), attn.project(h, 1), attn.project(h, 2)
        q, k = rotary.apply(q, cos, sin), rotary.apply(k, cos, sin)
        x = x + attn.o_proj(merge_heads(attn.core(q, k, v, key_lengths=lengths)))
        x = c * x + d * self.conv(self.norm_conv(x), pad)
        x = a * x + b * self.feed_forward2(self.norm_feed_forward2(x))
        return self.norm_out(x)


class LasrEncoder(BaseEncoder):
    """Log-mel (B, T, n_mels) → hidden (B, T', hidden_size), T' ≈ T / 4.  Offline only."""

    streaming_kind = "none"

    def __init__(self, config: LasrConfig):
        super().__init__()
        self.config = config
        self.subsampling_rate = config.subsampling_rate
        self.subsampler = LasrSubsampling(config)
        self.rotary_emb = RotaryEmbedding(config.head_dim, base=config.rope_theta)
        self.layers = nn.ModuleList(LasrBlock(config) for _ in range(config.num_hidden_layers))
        self.out_norm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps, bias=False)

    @property
    def output_size(self) -> int:
        return self.config.hidden_size

    def forward(self, feats: torch.Tensor, feat_lens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        batch, frames = feats.shape[:2]
        if feat_lens is None:
            feat_lens = torch.full((batch,), frames, dtype=torch.long, device=feats.device)
        need = self.config.min_frames()
        if frames < need:  # too short for one output frame: every row decodes to nothing
            feats = nn.functional.pad(feats, (0, 0, 0, need - frames))
        lengths = self.subsampler.output_lengths(feat_lens.to(feats.device).long())
        x = self.subsampler(feats)
        t = x.shape[1]
        lengths = lengths.clamp(max=t)
        cos, sin = self.rotary_emb.cos_sin(torch.arange(t, device=x.device), x.dtype)
        padded = bool((lengths < t).any())
        pad = (torch.arange(t, device=x.device)[None, :] >= lengths[:, None]) if padded else None
        key_lengths = lengths if padded else None
        for layer in self.layers:
            x = layer(x, cos, sin, self.rotary_emb, key_lengths, pad)
        return self.out_norm(x), lengths


class LasrForCtcModel(CtcHead, BaseAsrModel):
    """MedASR: the LASR encoder and its CTC head, decoded by the core ``ctc`` family."""

    config_class = LasrConfig
    #: BatchNorm's step counter is training state: never required from a checkpoint
    computed_buffer_suffixes = ("num_batches_tracked",)
    #: full self-attention over 25 encoder frames a second: 120 s is 3 000 frames, 36 MB of scores per
    #: head and layer; the engine cuts longer audio at silences rather than let the scores grow as T²
    max_segment_seconds = 120.0

    def __init__(self, config: LasrConfig):
        super().__init__(config)
        self.encoder = LasrEncoder(config)
        self._build_ctc_head(config)

    def encode_offline(self, feats: torch.Tensor, feat_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.encoder(feats, feat_lens)

    def quantization_layout(self) -> QuantLayout:
        groups = []
        for i in range(len(self.encoder.layers)):
            base = f"encoder.layers.{i}"
            groups += [SmoothGroup(f"{base}.norm_feed_forward1", (f"{base}.feed_forward1.linear1",)),
                       SmoothGroup(f"{base}.norm_self_att", tuple(f"{base}.self_attn.{p}" for p in _PROJECTIONS[:3])),
                       SmoothGroup(f"{base}.norm_feed_forward2", (f"{base}.feed_forward2.linear1",))]
        return QuantLayout(smooth_groups=tuple(groups))

    def extra_repr(self) -> str:
        c = self.config
        return f"hidden={c.hidden_size}, layers={c.num_hidden_layers}, vocab={c.vocab_size}, n_mels={c.num_mel_bins}"


__all__ = ["LasrEncoder", "LasrForCtcModel"]
