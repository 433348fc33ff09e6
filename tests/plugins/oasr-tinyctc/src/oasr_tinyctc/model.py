"""A tiny CTC recognizer built from the OASR layer waist."""

from __future__ import annotations

import attrs
import torch

from oasr import layers
from oasr.models import BaseAsrModel, BaseEncoder, BaseModelConfig


@attrs.define(kw_only=True)
class TinyCtcConfig(BaseModelConfig):
    input_dim: int = 80
    d_model: int = 32
    vocab_size: int = 16
    stride: int = 2

    @classmethod
    def tiny(cls) -> TinyCtcConfig:
        return cls()


class TinyCtcEncoder(BaseEncoder):
    def __init__(self, config: TinyCtcConfig):
        super().__init__()
        self.subsampling_rate = config.stride
        self.input_proj = layers.Linear(config.input_dim, config.d_model)
        self.conv = layers.Conv1d(config.d_model, config.d_model, 3, stride=config.stride, padding=1)
        self.act = layers.Swish()
        self.ffn = layers.FeedForward(config.d_model, 2 * config.d_model, "relu")
        self.norm = layers.LayerNorm(config.d_model)
        self._d = config.d_model

    @property
    def output_size(self) -> int:
        return self._d

    def forward(self, feats: torch.Tensor, lens: torch.Tensor):
        # zero the padding so a row's output does not depend on what it is batched with
        valid = torch.arange(feats.shape[1], device=feats.device)[None, :] < lens[:, None]
        x = self.input_proj(feats).masked_fill(~valid[..., None], 0.0)
        x = self.act(self.conv(x))
        out_lens = self.conv.output_length(lens)
        x = self.norm(x + self.ffn(x))
        return x, out_lens


class TinyCtcModel(BaseAsrModel):
    config_class = TinyCtcConfig

    def __init__(self, config: TinyCtcConfig):
        super().__init__(config)
        self.encoder = TinyCtcEncoder(config)
        self.ctc = layers.CtcProjection(config.d_model, config.vocab_size)

    @property
    def capabilities(self) -> frozenset[str]:
        return frozenset({"ctc"})

    def encode_offline(self, feats, feat_lens):
        return self.encoder(feats, feat_lens)

    def forward_offline(self, feats, feat_lens):
        hidden, lens = self.encoder(feats, feat_lens)
        return self.ctc(hidden), lens
