"""icefall's transducer joiner: ``output_linear(tanh(encoder_proj(e) + decoder_proj(d)))``.

Split as a :class:`~oasr.models.transducer.TransducerJoiner`: each encoder frame is projected once
(:meth:`Joiner.project_encoder`), each predictor output once per label (:meth:`Joiner.project_predictor`),
and :meth:`Joiner.joint` combines broadcastable projected inputs.  The tanh is a standalone waist
module: it acts on the projection sum, before the vocabulary GEMM, so no epilogue can carry it.
"""

from __future__ import annotations

import torch
from torch import nn

from oasr import layers
from oasr_models_icefall.transducer.config import JoinerConfig


class Joiner(nn.Module):
    """Parameter names are icefall's (``joiner.encoder_proj``, ``joiner.decoder_proj``, ``joiner.output_linear``)."""

    #: plain RNN-T: no duration logits
    durations: tuple[int, ...] = ()

    def __init__(self, config: JoinerConfig):
        super().__init__()
        self.config = config
        self.encoder_proj = layers.Linear(config.encoder_dim, config.joiner_dim)
        self.decoder_proj = layers.Linear(config.decoder_dim, config.joiner_dim)
        self.tanh = layers.Tanh()
        self.output_linear = layers.Linear(config.joiner_dim, config.vocab_size)

    def project_encoder(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.encoder_proj(hidden)

    def project_predictor(self, pred: torch.Tensor) -> torch.Tensor:
        return self.decoder_proj(pred)

    def joint(self, enc_proj: torch.Tensor, pred_proj: torch.Tensor) -> torch.Tensor:
        return self.output_linear(self.tanh(enc_proj + pred_proj))

    def forward(self, hidden: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
        """Logits of unprojected inputs (icefall's ``Joiner.forward(..., project_input=True)``)."""
        return self.joint(self.project_encoder(hidden), self.project_predictor(pred))
