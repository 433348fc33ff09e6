"""Parakeet models (Hugging Face ``parakeet_ctc``) on the FastConformer encoder.

Module names mirror transformers' ``ParakeetForCTC`` (``encoder.*``, ``ctc_head``) so its state dict loads
1:1; the one layout change is the CTC head, a kernel-size-1 ``Conv1d`` upstream (weight (V, D, 1)) and a
:class:`~oasr.layers.CtcProjection` here (weight (V, D)).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from oasr.layers import CtcProjection, Linear
from oasr.models.base import BaseAsrModel
from oasr.models.specs import QuantLayout, SmoothGroup
from oasr_models_hf.fastconformer.config import FastConformerConfig, ParakeetCtcConfig
from oasr_models_hf.fastconformer.encoder import FastConformerEncoder


def squeeze_k1(state: dict[str, torch.Tensor], key: str) -> None:
    """A kernel-size-1 ``Conv1d`` weight (O, I, 1) becomes the (O, I) weight of a linear, in place."""
    weight = state.get(key)
    if weight is not None and weight.dim() == 3 and weight.shape[-1] == 1:
        state[key] = weight[..., 0]


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


class ParakeetCtcModel(FastConformerModel):
    """Parakeet CTC: the FastConformer encoder and its CTC head, decoded by the core ``ctc`` family."""

    config_class = ParakeetCtcConfig

    def __init__(self, config: ParakeetCtcConfig):
        super().__init__(config)
        self.ctc_head = CtcProjection(config.hidden_size, config.vocab_size)

    @property
    def capabilities(self) -> frozenset[str]:
        return frozenset({"ctc"})

    def remap_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = dict(super().remap_state_dict(state_dict))
        squeeze_k1(out, "ctc_head.weight")
        return out

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The CTC head's raw logits (what transformers' ``ParakeetForCTC`` returns)."""
        return Linear.forward(self.ctc_head, hidden)

    def forward_offline(self, feats: torch.Tensor, feat_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden, lengths = self.encoder(feats, feat_lens)
        return self.ctc_head(hidden), lengths


__all__ = ["FastConformerModel", "ParakeetCtcModel"]
