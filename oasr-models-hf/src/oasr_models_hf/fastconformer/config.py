"""Configs of the FastConformer family in its Hugging Face layout (Parakeet CTC, RNN-T and TDT).

Encoder field names are transformers' ``ParakeetEncoderConfig`` (``hidden_size``, ``subsampling_factor``
...) and so are their defaults; the heads add ``vocab_size`` (the blank included) and, for the transducers,
the LSTM predictor's ``decoder_hidden_size`` / ``num_decoder_layers``, the joint's activation and TDT's
``durations``.  Load-bearing constants of the network, not knobs: LayerNorm and BatchNorm eps 1e-5, the
macaron feed-forward residuals ``x + 0.5 * ff``, the relative-position sinusoids over ``2T - 1``
positions with base 10 000.
"""

from __future__ import annotations

import attrs

from oasr.errors import ConfigError
from oasr.models.base import BaseModelConfig


def _int_tuple(value) -> tuple[int, ...]:
    return tuple(int(v) for v in value)


@attrs.define(kw_only=True)
class FastConformerConfig(BaseModelConfig):
    """The offline FastConformer encoder (transformers ``ParakeetEncoderConfig``) plus the vocabulary."""

    vocab_size: int = 1025
    num_mel_bins: int = 80
    hidden_size: int = 1024
    num_hidden_layers: int = 24
    num_attention_heads: int = 8
    intermediate_size: int = 4096
    hidden_act: str = "silu"
    attention_bias: bool = True
    convolution_bias: bool = True
    conv_kernel_size: int = 9
    subsampling_factor: int = 8
    subsampling_conv_channels: int = 256
    subsampling_conv_kernel_size: int = 3
    subsampling_conv_stride: int = 2
    scale_input: bool = True
    blank_id: int = 1024

    def __attrs_post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                              f"{self.num_attention_heads}", key="num_attention_heads")
        if self.hidden_size % 2:
            raise ConfigError(f"hidden_size {self.hidden_size} must be even (sin/cos position pairs)",
                              key="hidden_size")
        if self.hidden_act not in ("silu", "swish"):
            raise ConfigError(f"FastConformer hidden_act must be 'silu', got {self.hidden_act!r}", key="hidden_act")
        if self.conv_kernel_size % 2 == 0:
            raise ConfigError(f"conv_kernel_size must be odd ('same' padding), got {self.conv_kernel_size}",
                              key="conv_kernel_size")
        stages = self.subsampling_stages
        if stages < 1 or self.subsampling_conv_stride ** stages != self.subsampling_factor:
            raise ConfigError(f"subsampling_factor {self.subsampling_factor} must be a power of "
                              f"subsampling_conv_stride {self.subsampling_conv_stride}", key="subsampling_factor")
        if not 0 <= self.blank_id < self.vocab_size:
            raise ConfigError(f"blank_id {self.blank_id} is outside the vocabulary of {self.vocab_size}",
                              key="blank_id")

    @property
    def subsampling_stages(self) -> int:
        stages, factor = 0, self.subsampling_factor
        while factor > 1 and factor % self.subsampling_conv_stride == 0:
            factor //= self.subsampling_conv_stride
            stages += 1
        return stages if factor == 1 else -1

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def tiny(cls) -> FastConformerConfig:
        return cls(vocab_size=40, blank_id=39, num_mel_bins=16, hidden_size=32, num_hidden_layers=1,
                   num_attention_heads=2, intermediate_size=64, conv_kernel_size=5, subsampling_conv_channels=8)


@attrs.define(kw_only=True)
class ParakeetCtcConfig(FastConformerConfig):
    """``parakeet_ctc``: the encoder and a k=1 convolution CTC head; the blank is the last id."""


@attrs.define(kw_only=True)
class ParakeetRnntConfig(FastConformerConfig):
    """``parakeet_rnnt``: + an LSTM predictor and an additive joint ``head(act(enc_proj + pred_proj))``."""

    vocab_size: int = 8193
    blank_id: int = 8192
    decoder_hidden_size: int = 640
    num_decoder_layers: int = 2
    #: the joint's width (its two projections' outputs, the head's input); None: ``decoder_hidden_size``
    #: (transformers ties them; NeMo's ``joint.jointnet.joint_hidden`` may differ)
    joint_hidden_size: int | None = None
    joint_act: str = "relu"
    max_symbols_per_step: int = 10

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        if self.joint_act not in ("relu", "tanh", "sigmoid"):
            raise ConfigError(f"joint activation must be relu, tanh or sigmoid, got {self.joint_act!r}",
                              key="hidden_act")
        if self.max_symbols_per_step < 1:
            raise ConfigError(f"max_symbols_per_step must be >= 1, got {self.max_symbols_per_step}",
                              key="max_symbols_per_step")

    @property
    def durations(self) -> tuple[int, ...]:
        return ()

    @classmethod
    def tiny(cls) -> ParakeetRnntConfig:
        return cls(vocab_size=40, blank_id=39, num_mel_bins=16, hidden_size=32, num_hidden_layers=1,
                   num_attention_heads=2, intermediate_size=64, conv_kernel_size=5, subsampling_conv_channels=8,
                   decoder_hidden_size=24, num_decoder_layers=1)


@attrs.define(kw_only=True)
class ParakeetTdtConfig(ParakeetRnntConfig):
    """``parakeet_tdt``: the joint's last ``len(durations)`` logits score how many frames a step skips."""

    tdt_durations: tuple[int, ...] = attrs.field(default=(0, 1, 2, 3, 4), converter=_int_tuple)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        if not self.tdt_durations or min(self.tdt_durations) < 0:
            raise ConfigError(f"TDT durations must be a non-empty list of frame counts >= 0, got "
                              f"{list(self.tdt_durations)}", key="durations")

    @property
    def durations(self) -> tuple[int, ...]:
        return self.tdt_durations

    @classmethod
    def tiny(cls) -> ParakeetTdtConfig:
        base = ParakeetRnntConfig.tiny()
        return cls(**{f.name: getattr(base, f.name) for f in attrs.fields(ParakeetRnntConfig)})
