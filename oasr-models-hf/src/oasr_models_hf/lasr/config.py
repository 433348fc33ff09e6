"""MedASR's model config (Hugging Face ``lasr_ctc``): the Conformer-CTC shape and its load-bearing constants.

Field names are those of transformers' ``LasrEncoderConfig`` (``hidden_size``, ``num_hidden_layers`` ...)
plus the CTC head's ``vocab_size``.  The residual weights are part of the trained network, not knobs:
the macaron feed-forwards add ``x * 1.5 + ff * 0.5`` and the convolution module ``x * 2.0 + conv``
(the attention residual is unscaled); LayerNorms carry no bias and use eps 1e-6; RoPE is NeoX-style
with theta 10 000.
"""

from __future__ import annotations

import attrs

from oasr.errors import ConfigError
from oasr.models.base import BaseModelConfig


def _pair(value) -> tuple[float, float]:
    pair = tuple(float(v) for v in value)
    if len(pair) != 2:
        raise ConfigError(f"residual weights must be two numbers, got {value!r}", key="residual_weights")
    return pair  # type: ignore[return-value]


@attrs.define(kw_only=True)
class LasrConfig(BaseModelConfig):
    """Shape of a LASR Conformer-CTC (transformers ``LasrCTCConfig`` + its ``encoder_config``)."""

    vocab_size: int = 512
    num_mel_bins: int = 128
    hidden_size: int = 512
    num_hidden_layers: int = 17
    num_attention_heads: int = 8
    intermediate_size: int = 2048
    hidden_act: str = "silu"
    attention_bias: bool = False
    convolution_bias: bool = False
    conv_kernel_size: int = 32
    subsampling_conv_channels: int = 256
    subsampling_conv_kernel_size: int = 5
    subsampling_conv_stride: int = 2
    layer_norm_eps: float = 1e-6
    batch_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    feed_forward_residual_weights: tuple[float, float] = attrs.field(default=(1.5, 0.5), converter=_pair)
    conv_residual_weights: tuple[float, float] = attrs.field(default=(2.0, 1.0), converter=_pair)
    blank_id: int = 0

    def __attrs_post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                              f"{self.num_attention_heads}", key="num_attention_heads")
        if (self.hidden_size // self.num_attention_heads) % 2:
            raise ConfigError(f"head dim {self.hidden_size // self.num_attention_heads} must be even for RoPE",
                              key="num_attention_heads")
        if self.hidden_act not in ("silu", "swish"):
            raise ConfigError(f"LASR hidden_act must be 'silu', got {self.hidden_act!r}", key="hidden_act")
        if not 0 <= self.blank_id < self.vocab_size:
            raise ConfigError(f"blank_id {self.blank_id} is outside the vocabulary of {self.vocab_size}",
                              key="blank_id")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def subsampling_rate(self) -> int:
        return self.subsampling_conv_stride ** 2

    def min_frames(self) -> int:
        """The fewest feature frames that give one encoder frame."""
        k, s = self.subsampling_conv_kernel_size, self.subsampling_conv_stride
        return (k - 1) * s + k

    @classmethod
    def tiny(cls) -> LasrConfig:
        return cls(vocab_size=40, num_mel_bins=16, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                   intermediate_size=64, conv_kernel_size=8, subsampling_conv_channels=16)
