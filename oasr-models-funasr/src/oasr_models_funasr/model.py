"""The ``paraformer`` architecture: FunASR's Paraformer and BiCifParaformer.

SANM encoder → CIF predictor (token count and acoustic embeddings) → SANM decoder, one parallel
pass.  Checkpoint keys load 1:1 except two declarative renames (the FSMN kernel sits in its own
module here) and the BiCif upsampling convolution, which is stored as the equivalent linear
(a stride-``U`` kernel-``U`` transposed convolution maps each frame to ``U`` frames independently).
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import torch

from oasr.models import BaseAsrModel
from oasr_models_funasr.config import ParaformerConfig
from oasr_models_funasr.decoder import ParaformerDecoder
from oasr_models_funasr.encoder import SANMEncoder
from oasr_models_funasr.predictor import CifPredictor

UPSAMPLE_SOURCE = "predictor.upsample_cnn."


@attrs.define(frozen=True)
class ParaformerOutput:
    """One batch through the model: decoder log-probs (B, N, V) over ``token_lens`` tokens per row, the
    encoder output and lengths, and the predictor's alphas/fires (with the tail frame)."""

    log_probs: torch.Tensor
    token_lens: torch.Tensor
    hidden: torch.Tensor
    hidden_lens: torch.Tensor
    alphas: torch.Tensor
    fires: torch.Tensor


class ParaformerModel(BaseAsrModel):
    config_class = ParaformerConfig
    weight_renames = ((r"\.self_attn\.fsmn_block\.", ".self_attn.fsmn.fsmn_block."),)

    def __init__(self, config: ParaformerConfig):
        super().__init__(config)
        self.encoder = SANMEncoder(config.encoder)
        self.predictor = CifPredictor(config.predictor)
        self.decoder = ParaformerDecoder(config.decoder)

    @property
    def capabilities(self) -> frozenset[str]:
        return frozenset({"paraformer"})

    def remap_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = super().remap_state_dict(state_dict)
        weight, bias = out.pop(UPSAMPLE_SOURCE + "weight", None), out.pop(UPSAMPLE_SOURCE + "bias", None)
        if weight is not None:
            # ConvTranspose1d weight (C_in, C_out, U) → linear (C_out · U, C_in), row o·U + k
            c_in, c_out, up = weight.shape
            out["predictor.upsample.weight"] = weight.permute(1, 2, 0).reshape(c_out * up, c_in)
            if bias is not None:
                out["predictor.upsample.bias"] = bias.repeat_interleave(up)
        return out

    def encode_offline(self, feats: torch.Tensor, feat_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.encoder(feats, feat_lens)

    def recognize(self, feats: torch.Tensor, feat_lens: torch.Tensor) -> ParaformerOutput:
        """Encoder, predictor and decoder over a batch of LFR features (before CMVN)."""
        hidden, lens = self.encoder(feats, feat_lens)
        embeds, token_num, alphas, fires = self.predictor(hidden, lens)
        token_lens = token_num.round().long()
        if embeds.shape[1] == 0 or int(token_lens.max()) < 1:
            log_probs = hidden.new_zeros(hidden.shape[0], 0, self.config.vocab_size)
        else:
            log_probs = self.decoder(hidden, lens, embeds.to(hidden.dtype), token_lens)
        return ParaformerOutput(log_probs, token_lens, hidden, lens, alphas, fires)
