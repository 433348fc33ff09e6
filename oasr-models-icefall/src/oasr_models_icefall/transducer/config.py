"""Configuration of the icefall transducer (``transducer`` architecture).

Field names follow icefall's ``train.py`` flags (``--decoder-dim``, ``--joiner-dim``,
``--context-size``); the converter infers every one of them from the release's tensor shapes.
"""

from __future__ import annotations

import attrs

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
