"""icefall's scaled Conformer encoder (``conformer_ctc3``, the ``pruned_transducer_stateless2`` design).

The layer differs from the ESPnet/WeNet Conformer in ways that all change the numbers:

* no LayerNorm anywhere: each layer ends in ``BasicNorm`` (``x · (mean(x²) + exp(log_eps))^-½``,
  no affine) and the residual branches are added unscaled (the macaron feed-forward included);
* ``DoubleSwish`` (``x · sigmoid(x − 1)``) is the activation of the feed-forwards, the convolution
  module and the subsampling; the convolution module has no batch norm;
* the attention scales the query by ``head_dim^-½`` *before* adding ``pos_bias_u``/``pos_bias_v``,
  and the positional table is not multiplied by ``sqrt(d_model)`` (neither is the input);
* ``ActivationBalancer`` and the layer-bypass ``alpha`` act only in training: identity here.

Checkpoints store icefall's ``ScaledLinear``/``ScaledConv`` parameters as ``weight`` plus a log-scale
``weight_scale``; the model folds ``weight · exp(weight_scale)`` into plain waist layers when it loads
(``ConformerCtcModel.remap_state_dict``), as icefall's own ``scaling_converter`` does for export.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from oasr import layers
from oasr.models import BaseEncoder
from oasr_models_icefall.conformer_ctc3.config import ConformerCtcConfig


class DoubleSwish(nn.Module):
    """``x · sigmoid(x − 1)``: icefall's DoubleSwish (parameter-free)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x - 1.0)


class BasicNorm(nn.Module):
    """icefall's BasicNorm over the last axis; ``eps`` holds log(epsilon) as the checkpoint stores it.

    The subsampling's norm keeps ``eps`` as a buffer (``learn_eps=False``), a layer's norm as a
    parameter; both load from the same key, so one buffer serves both.
    """

    def __init__(self, eps: float = 0.25):
        super().__init__()
        self.register_buffer("eps", torch.tensor(math.log(eps)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps.exp())


class Conv2dSubsampling(nn.Module):
    """Three 3×3 convolutions (stride 1, 2, 2; DoubleSwish after each) + linear + BasicNorm:
    (B, T, F) → (B, ((T − 1) // 2 − 1) // 2, D)."""

    def __init__(self, config: ConformerCtcConfig):
        super().__init__()
        c1, c2, c3 = config.subsampling_channels
        self.conv1 = layers.Conv2d(1, c1, 3, padding=1)
        self.conv2 = layers.Conv2d(c1, c2, 3, stride=2)
        self.conv3 = layers.Conv2d(c2, c3, 3, stride=2)
        self.act = DoubleSwish()
        self.out = layers.Linear(c3 * config.subsampled_feature_dim, config.encoder_dim)
        self.out_norm = BasicNorm()

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        x = feats.unsqueeze(1)
        for conv in (self.conv1, self.conv2, self.conv3):
            x = self.act(conv(x))
        b, c, t, f = x.shape
        return self.out_norm(self.out(x.transpose(1, 2).reshape(b, t, c * f)))

    @staticmethod
    def output_lengths(lengths: torch.Tensor) -> torch.Tensor:
        return (((lengths - 1) >> 1) - 1) >> 1


def relative_position_table(length: int, dim: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(2·length − 1, dim) sinusoids for relative positions length−1 … −(length−1), in that order
    (sin on even, cos on odd columns): the slice icefall's RelPositionalEncoding hands the layers."""
    positions = torch.arange(length - 1, -length, -1, dtype=torch.float32, device=device)[:, None]
    div = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32, device=device) * -(math.log(10000.0) / dim))
    table = torch.zeros(2 * length - 1, dim, device=device)
    table[:, 0::2] = torch.sin(positions * div)
    table[:, 1::2] = torch.cos(positions * div)
    return table.to(dtype)


def relative_shift(scores: torch.Tensor) -> torch.Tensor:
    """(B, H, T, 2T − 1) scores against the position table → (B, H, T, T), entry (i, j) taken from
    column T − 1 − i + j (relative position i − j)."""
    t = scores.shape[-2]
    index = (t - 1) - torch.arange(t, device=scores.device)[:, None] + torch.arange(t, device=scores.device)[None, :]
    return scores.gather(-1, index.expand(*scores.shape[:-1], t))


class RelPositionMultiheadAttention(nn.Module):
    """Transformer-XL attention with icefall's fused ``in_proj`` (q, k, v stacked) and ``linear_pos``."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.in_proj = layers.Linear(d_model, 3 * d_model)
        self.out_proj = layers.Linear(d_model, d_model)
        self.linear_pos = layers.Linear(d_model, d_model, bias=False)
        self.pos_bias_u = nn.Parameter(torch.zeros(n_heads, self.head_dim))
        self.pos_bias_v = nn.Parameter(torch.zeros(n_heads, self.head_dim))
        self.core = layers.Attention(n_heads, self.head_dim, scale=1.0)

    def forward(self, x: torch.Tensor, pos_table: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        q, k, v = (layers.split_heads(part, self.n_heads) for part in self.in_proj(x).chunk(3, dim=-1))
        q = q * self.head_dim ** -0.5  # before the position biases, as icefall scales it
        p = layers.split_heads(self.linear_pos(pos_table)[None], self.n_heads)  # (1, H, 2T-1, Dh)
        bd = relative_shift(torch.matmul(q + self.pos_bias_v[None, :, None], p.transpose(-1, -2)))
        out = self.core(q + self.pos_bias_u[None, :, None], k, v, bias=bd, key_lengths=lengths)
        return self.out_proj(layers.merge_heads(out))


class ScaledFeedForward(nn.Module):
    """``w_2(DoubleSwish(w_1(x)))`` (icefall's ``feed_forward.0`` / ``feed_forward.4``)."""

    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.w_1 = layers.Linear(d_model, hidden)
        self.act = DoubleSwish()
        self.w_2 = layers.Linear(hidden, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_2(self.act(self.w_1(x)))


class ConvolutionModule(nn.Module):
    """pointwise (2C) → GLU → padded frames zeroed → depthwise → DoubleSwish → pointwise."""

    def __init__(self, channels: int, kernel_size: int, causal: bool):
        super().__init__()
        pad = (kernel_size - 1, 0) if causal else ((kernel_size - 1) // 2,) * 2
        self.pointwise_conv1 = layers.PointwiseConv1d(channels, 2 * channels)
        self.glu = layers.Glu(dim=-1)
        self.depthwise_conv = layers.DepthwiseConv1d(channels, kernel_size, padding=pad)
        self.act = DoubleSwish()
        self.pointwise_conv2 = layers.PointwiseConv1d(channels, channels)

    def forward(self, x: torch.Tensor, pad_mask: torch.Tensor) -> torch.Tensor:
        x = self.glu(self.pointwise_conv1(x)).masked_fill(pad_mask[..., None], 0.0)
        return self.pointwise_conv2(self.act(self.depthwise_conv(x)))


class ConformerEncoderLayer(nn.Module):
    def __init__(self, config: ConformerCtcConfig):
        super().__init__()
        d = config.encoder_dim
        self.feed_forward_macaron = ScaledFeedForward(d, config.dim_feedforward)
        self.self_attn = RelPositionMultiheadAttention(d, config.nhead)
        self.conv_module = ConvolutionModule(d, config.cnn_module_kernel, config.causal)
        self.feed_forward = ScaledFeedForward(d, config.dim_feedforward)
        self.norm_final = BasicNorm()

    def forward(self, x: torch.Tensor, pos_table: torch.Tensor, lengths: torch.Tensor,
                pad_mask: torch.Tensor) -> torch.Tensor:
        x = x + self.feed_forward_macaron(x)
        x = x + self.self_attn(x, pos_table, lengths)
        x = x + self.conv_module(x, pad_mask)
        x = x + self.feed_forward(x)
        return self.norm_final(x)


class ConformerEncoder(BaseEncoder):
    """``encoder_embed`` (Conv2dSubsampling) + ``layers``: (B, T, F) log-mel → (B, T', D)."""

    streaming_kind = "none"
    subsampling_rate = 4

    def __init__(self, config: ConformerCtcConfig):
        super().__init__()
        self.config = config
        self.encoder_embed = Conv2dSubsampling(config)
        self.layers = nn.ModuleList(ConformerEncoderLayer(config) for _ in range(config.num_encoder_layers))

    @property
    def output_size(self) -> int:
        return self.config.encoder_dim

    def forward(self, feats: torch.Tensor, feat_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A row's valid outputs do not depend on its padding: encoder frame t reads feature frames
        up to 4t + 3 ≤ T − 1, padded keys are masked and padded frames are zeroed before the
        depthwise convolution (so any padding value gives icefall's batched result)."""
        x = self.encoder_embed(feats)
        lengths = Conv2dSubsampling.output_lengths(feat_lens).to(x.device)
        pad_mask = torch.arange(x.shape[1], device=x.device)[None, :] >= lengths[:, None]
        pos_table = relative_position_table(x.shape[1], self.config.encoder_dim, x.device, x.dtype)
        for layer in self.layers:
            x = layer(x, pos_table, lengths, pad_mask)
        return x, lengths
