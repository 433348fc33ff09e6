"""Parakeet models (Hugging Face ``parakeet_ctc``, ``parakeet_rnnt``, ``parakeet_tdt``) on the FastConformer encoder.

Module names mirror transformers' ``ParakeetForCTC`` / ``ParakeetForRNNT`` (``encoder.*``, ``ctc_head``,
``decoder.*``, ``joint.head``) so their state dicts load 1:1, with two layout changes: the CTC head is a
kernel-size-1 ``Conv1d`` upstream (weight (V, D, 1)) and a :class:`~oasr.layers.CtcProjection` here (weight
(V, D)); the transducers' ``encoder_projector`` and ``decoder.decoder_projector`` live in the joint here
(``joint.encoder_projector``, ``joint.decoder_projector``), which applies them.
"""

from __future__ import annotations

import torch

from oasr.models.base import BaseAsrModel
from oasr.models.specs import QuantLayout, SmoothGroup
from oasr_models_hf.fastconformer.config import (
    FastConformerConfig,
    ParakeetCtcConfig,
    ParakeetRnntConfig,
    ParakeetTdtConfig,
)
from oasr_models_hf.fastconformer.encoder import FastConformerEncoder
from oasr_models_hf.fastconformer.predictor import CtcHead, LstmTransducerHeads


class FastConformerModel(BaseAsrModel):
    """The parts every FastConformer model shares: the encoder, BatchNorm's counter, the quantization groups."""

    config_class = FastConformerConfig
    #: BatchNorm's step counter is training state: never required from a checkpoint
    computed_buffer_suffixes = ("num_batches_tracked",)
    #: full self-attention over 12.5 encoder frames a second: 300 s is 3 750 frames; the engine cuts longer
    #: audio at silences rather than let the (T x 2T) position scores grow further
    max_segment_seconds = 300.0

    def __init__(self, config: FastConformerConfig):
        super().__init__(config)
        self.encoder = FastConformerEncoder(config)

    def encode_offline(self, feats: torch.Tensor, feat_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.encoder(feats, feat_lens)

    def quantization_layout(self) -> QuantLayout:
        groups = []
        for i in range(len(self.encoder.layers)):
            base = f"encoder.layers.{i}"
            groups += [SmoothGroup(f"{base}.norm_feed_forward1", (f"{base}.feed_forward1.linear1",)),
                       SmoothGroup(f"{base}.norm_self_att", tuple(f"{base}.self_attn.{p}"
                                                                  for p in ("q_proj", "k_proj", "v_proj"))),
                       SmoothGroup(f"{base}.norm_feed_forward2", (f"{base}.feed_forward2.linear1",))]
        return QuantLayout(smooth_groups=tuple(groups))

    def extra_repr(self) -> str:
        c = self.config
        return (f"hidden={c.hidden_size}, layers={c.num_hidden_layers}, vocab={c.vocab_size}, "
                f"n_mels={c.num_mel_bins}, subsampling={c.subsampling_factor}")


class ParakeetCtcModel(CtcHead, FastConformerModel):
    """Parakeet CTC: the FastConformer encoder and its CTC head, decoded by the core ``ctc`` family."""

    config_class = ParakeetCtcConfig

    def __init__(self, config: ParakeetCtcConfig):
        super().__init__(config)
        self._build_ctc_head(config)


class ParakeetRnntModel(LstmTransducerHeads, FastConformerModel):
    """Parakeet RNN-T: the encoder, an LSTM predictor and an additive joint, decoded by the core ``transducer``
    family (greedy; the recurrent predictor state rules out beam search)."""

    config_class = ParakeetRnntConfig

    def __init__(self, config: ParakeetRnntConfig):
        super().__init__(config)
        self._build_heads(config)

    def extra_repr(self) -> str:
        c = self.config
        return super().extra_repr() + f", predictor={c.num_decoder_layers}x{c.decoder_hidden_size}"


class ParakeetTdtModel(ParakeetRnntModel):
    """Parakeet TDT: the RNN-T network whose joint also scores the frames each step skips (``durations``)."""

    config_class = ParakeetTdtConfig


__all__ = ["FastConformerModel", "ParakeetCtcModel", "ParakeetRnntModel", "ParakeetTdtModel"]
