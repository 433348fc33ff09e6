"""The ``icefall_conformer`` architecture: icefall's ``conformer_ctc3`` (scaled Conformer + CTC head).

Checkpoint keys load through declarative renames (icefall's ``nn.Sequential`` indices become names)
after one folding step: every ``<name>_scale`` log-scale of a ScaledLinear/ScaledConv or of a
position bias multiplies its tensor (``weight · exp(weight_scale)``) and is consumed.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from oasr import layers
from oasr.errors import CheckpointFormatError
from oasr.models import BaseAsrModel
from oasr_models_icefall.conformer_ctc3.config import ConformerCtcConfig
from oasr_models_icefall.conformer_ctc3.encoder import ConformerEncoder

#: the tensors icefall stores with a log-scale beside them (``<tensor>_scale``)
SCALED_SUFFIXES = ("weight", "bias", "pos_bias_u", "pos_bias_v")


def fold_log_scales(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``X`` and ``X_scale`` → ``X · exp(X_scale)`` for every scaled tensor; other keys unchanged."""
    out = dict(state_dict)
    for key in list(out):
        if not key.endswith("_scale"):
            continue
        base = key[: -len("_scale")]
        if base.rsplit(".", 1)[-1] not in SCALED_SUFFIXES:
            continue
        if base not in out:
            raise CheckpointFormatError(f"checkpoint has the log-scale {key!r} but not the tensor {base!r} it scales")
        scale = out.pop(key)
        if scale.numel() != 1:
            raise CheckpointFormatError(f"checkpoint log-scale {key!r} has shape {tuple(scale.shape)}, expected a scalar")
        out[base] = out[base] * scale.float().exp().to(out[base].dtype)
    return out


class ConformerCtcModel(BaseAsrModel):
    """``encoder`` (:class:`ConformerEncoder`) and ``ctc_output`` (linear + log-softmax)."""

    config_class = ConformerCtcConfig
    weight_renames = (
        (r"^encoder\.encoder_embed\.conv\.0\.", "encoder.encoder_embed.conv1."),
        (r"^encoder\.encoder_embed\.conv\.3\.", "encoder.encoder_embed.conv2."),
        (r"^encoder\.encoder_embed\.conv\.6\.", "encoder.encoder_embed.conv3."),
        (r"^encoder\.encoder\.layers\.", "encoder.layers."),
        (r"\.(feed_forward(?:_macaron)?)\.0\.", r".\1.w_1."),
        (r"\.(feed_forward(?:_macaron)?)\.4\.", r".\1.w_2."),
        (r"^ctc_output_module\.1\.", "ctc_output."),
    )

    def __init__(self, config: ConformerCtcConfig):
        super().__init__(config)
        self.encoder = ConformerEncoder(config)
        self.ctc_output = layers.CtcProjection(config.encoder_dim, config.vocab_size)

    @property
    def capabilities(self) -> frozenset[str]:
        return frozenset({"ctc"})

    def remap_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return super().remap_state_dict(fold_log_scales(state_dict))

    def encode_offline(self, feats: torch.Tensor, feat_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.encoder(feats, feat_lens)

    def ctc_log_probs(self, hidden: torch.Tensor) -> torch.Tensor:
        """Encoder hidden states (B, T', D) → CTC log-probs (B, T', V), float32."""
        return self.ctc_output(hidden)

    def forward_offline(self, feats: torch.Tensor, feat_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden, lens = self.encode_offline(feats, feat_lens)
        return self.ctc_output(hidden), lens
