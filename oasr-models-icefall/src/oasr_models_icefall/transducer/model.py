"""The ``transducer`` architecture: icefall's RNN-T — an encoder, the stateless decoder, the joiner.

Checkpoint keys are icefall's: ``encoder_embed.*`` / ``encoder.*`` move under the OASR encoder
module (the Zipformer's renames), ``decoder.*`` and ``joiner.*`` load 1:1.  The model exposes the
transducer contract the core ``transducer`` decode family drives: ``encode_offline``, ``predictor``
(the :class:`StatelessDecoder`) and ``joiner``.  Streaming follows the encoder: a causal Zipformer
streams on the ``slot`` backend, a non-causal one does not stream.
"""

from __future__ import annotations

import torch

from oasr.models import BaseAsrModel, QuantLayout
from oasr_models_icefall.transducer.config import TransducerModelConfig
from oasr_models_icefall.transducer.decoder import StatelessDecoder
from oasr_models_icefall.transducer.joiner import Joiner
from oasr_models_icefall.zipformer.encoder import ZipformerEncoderModel
from oasr_models_icefall.zipformer.model import ENCODER_RENAMES, ZipformerOptions


class TransducerModel(BaseAsrModel):
    """``encoder`` (Zipformer2), ``decoder`` (stateless predictor) and ``joiner``."""

    config_class = TransducerModelConfig
    #: the encoder's offline chunk-mask geometry (a causal Zipformer: the checkpoint's by default)
    options_class = ZipformerOptions
    weight_renames = ENCODER_RENAMES

    def __init__(self, config: TransducerModelConfig):
        super().__init__(config)
        self.encoder = ZipformerEncoderModel(config.encoder)
        self.decoder = StatelessDecoder(config.decoder)
        self.joiner = Joiner(config.joiner)

    @property
    def predictor(self) -> StatelessDecoder:
        """The transducer predictor (icefall's ``decoder``)."""
        return self.decoder

    @property
    def blank_id(self) -> int:
        return self.decoder.blank_id

    @property
    def capabilities(self) -> frozenset[str]:
        return frozenset({"transducer"})

    def quantization_layout(self) -> QuantLayout:
        """int8 goes to the encoder; the joiner stays at full precision.  It decides every emission by
        an argmax over small logit margins: on the icefall fixtures (random weights, greedy), an int8
        joiner kept 18 % of icefall's tokens even over an fp32 encoder, an fp32 joiner over an int8
        encoder 72 %.  The decoder has no linears (an embedding and a grouped convolution)."""
        return QuantLayout(keep_full_precision=("joiner",))

    def encode_offline(self, feats: torch.Tensor, feat_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.encoder(feats, feat_lens, chunk_size=self.options.chunk_size,
                            left_context_frames=self.options.left_context_frames)
