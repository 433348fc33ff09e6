"""Configuration of the icefall transducer (``transducer`` architecture).

Field names follow icefall's ``train.py`` flags (``--decoder-dim``, ``--joiner-dim``,
``--context-size``); the converter infers every one of them from the release's tensor shapes.
"""

from __future__ import annotations

import attrs

from oasr.models import BaseModelConfig
from oasr_models_icefall.zipformer.config import ZipformerCtcModelConfig, ZipformerEncoderConfig

#: the acoustic encoders a transducer can be built on
ENCODER_TYPES = ("zipformer",)


@attrs.define(kw_only=True)
class StatelessDecoderConfig:
    """icefall's stateless decoder: embedding + grouped convolution over the last ``context_size`` labels."""

    vocab_size: int
    decoder_dim: int
    blank_id: int = 0
    #: labels the prediction sees (1: bigram, 2: trigram — icefall's default)
    context_size: int = 2
    #: channels per convolution group (icefall: ``groups = decoder_dim // 4``)
    conv_group_size: int = 4


@attrs.define(kw_only=True)
class JoinerConfig:
    """icefall's joiner: two input projections to ``joiner_dim``, tanh, the vocabulary projection."""

    encoder_dim: int
    decoder_dim: int
    joiner_dim: int
    vocab_size: int


@attrs.define(kw_only=True)
class TransducerModelConfig(BaseModelConfig):
    """An icefall transducer: an acoustic encoder, the stateless decoder and the joiner.

    ``encoder_type`` names the encoder ``encoder`` configures (today icefall's Zipformer2, the one
    the transducer releases ship with).
    """

    vocab_size: int
    encoder_type: str = attrs.field(default="zipformer", validator=attrs.validators.in_(ENCODER_TYPES))
    encoder: ZipformerEncoderConfig
    decoder: StatelessDecoderConfig
    joiner: JoinerConfig

    def __attrs_post_init__(self) -> None:
        widths = {"decoder.vocab_size": self.decoder.vocab_size, "joiner.vocab_size": self.joiner.vocab_size}
        for field, value in widths.items():
            if value != self.vocab_size:
                raise ValueError(f"{field} is {value} but vocab_size is {self.vocab_size}")
        if self.joiner.decoder_dim != self.decoder.decoder_dim:
            raise ValueError(f"joiner.decoder_dim {self.joiner.decoder_dim} != decoder.decoder_dim "
                             f"{self.decoder.decoder_dim}")
        if self.joiner.encoder_dim != self.encoder.output_size:
            raise ValueError(f"joiner.encoder_dim {self.joiner.encoder_dim} != the encoder's output size "
                             f"{self.encoder.output_size}")

    @property
    def blank_id(self) -> int:
        return self.decoder.blank_id

    @classmethod
    def tiny(cls) -> TransducerModelConfig:
        encoder = ZipformerCtcModelConfig.tiny().encoder
        vocab = 16
        return cls(vocab_size=vocab, encoder=encoder,
                   decoder=StatelessDecoderConfig(vocab_size=vocab, decoder_dim=8, context_size=2),
                   joiner=JoinerConfig(encoder_dim=encoder.output_size, decoder_dim=8, joiner_dim=12,
                                       vocab_size=vocab))
