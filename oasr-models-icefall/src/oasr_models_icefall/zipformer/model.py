"""The ``zipformer`` architecture: icefall's Zipformer2 encoder + CTC head (``ctc_output``).

Checkpoint keys load 1:1 below two declarative prefix renames: icefall's top-level
``encoder_embed.*`` and ``encoder.*`` live under the OASR encoder module
(``encoder.encoder_embed.*``, ``encoder.encoder.*``).  The renames leave already-renamed (native
bundle) keys alone.
"""

from __future__ import annotations

import attrs
import torch
from torch import nn

from oasr import layers
from oasr.models import BaseAsrModel
from oasr_models_icefall.zipformer.config import ZipformerCtcModelConfig
from oasr_models_icefall.zipformer.encoder import ZipformerEncoderModel

#: icefall's top-level encoder prefixes → the OASR encoder module (idempotent on renamed keys)
ENCODER_RENAMES = ((r"^(encoder_embed|encoder)\.(?!encoder_embed\.|encoder\.)", r"encoder.\1."),)


@attrs.define
class ZipformerOptions:
    """Inference options: the offline chunk-mask geometry of a causal model, in embed frames
    (None: the checkpoint's, chunk 16 / left context 128 for a release; chunk_size -1: no mask)."""

    chunk_size: int | None = None
    left_context_frames: int | None = None


class ZipformerCtcModel(BaseAsrModel):
    """``encoder`` (:class:`ZipformerEncoderModel`) + ``ctc_output`` (icefall's
    ``Sequential(Dropout, Linear, LogSoftmax)``; the linear keeps index 1)."""

    config_class = ZipformerCtcModelConfig
    options_class = ZipformerOptions
    weight_renames = ENCODER_RENAMES

    def __init__(self, config: ZipformerCtcModelConfig):
        super().__init__(config)
        self.encoder = ZipformerEncoderModel(config.encoder)
        self.ctc_output = nn.Sequential(nn.Identity(), layers.CtcProjection(config.encoder.output_size,
                                                                            config.vocab_size))

    @property
    def capabilities(self) -> frozenset[str]:
        return frozenset({"ctc"})

    def configure(self, options: ZipformerOptions) -> None:
        """Apply the options, refusing a chunk geometry this checkpoint cannot decode with."""
        self.encoder.encoder.check_chunk_geometry(options.chunk_size, options.left_context_frames)
        super().configure(options)

    def encode_offline(self, feats: torch.Tensor, feat_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.encoder(feats, feat_lens, chunk_size=self.options.chunk_size,
                            left_context_frames=self.options.left_context_frames)

    def ctc_log_probs(self, hidden: torch.Tensor) -> torch.Tensor:
        """Encoder hidden states (B, T', D) → CTC log-probs (B, T', V), float32."""
        return self.ctc_output(hidden)

    def forward_offline(self, feats: torch.Tensor, feat_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden, lens = self.encode_offline(feats, feat_lens)
        return self.ctc_log_probs(hidden), lens
