"""``toyframe``: a causal toy recognizer whose layers differ in width and kernel, built on the waist.

Frames are centred per frame, stacked ``stride`` at a time, projected, offset by the request's
language embedding (a prompt), then run through causal depthwise-conv layers of per-layer width and
kernel, each followed by a ReLU projection to the next width.  A layer's only memory is its last
``kernel - 1`` input frames, so a chunk with those frames as state computes exactly what the whole
utterance does: streaming equals offline.

The streaming state is declared per layer tensor (``slot``), plus the prompt as a *persistent*
state written from the request at admission; the same chunk function backs ``stateful``.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from oasr import layers
from oasr.errors import ConfigError
from oasr.models import BaseAsrModel, BaseEncoder, BaseModelConfig, StreamingGeometry, StreamStateSpec


@attrs.define(kw_only=True)
class ToyFrameConfig(BaseModelConfig):
    input_dim: int = 80
    stride: int = 2
    widths: tuple[int, ...] = (24, 16)
    kernels: tuple[int, ...] = (3, 5)
    vocab_size: int = 12
    languages: tuple[str, ...] = ("en", "fr", "de")
    #: "slot", "stateful" or "none"
    streaming_kind: str = "slot"

    def __attrs_post_init__(self) -> None:
        if len(self.widths) != len(self.kernels) or min(self.kernels) < 2:
            raise ConfigError(f"ToyFrameConfig: one kernel >= 2 per layer width, got {self.widths}, {self.kernels}")

    @classmethod
    def tiny(cls) -> ToyFrameConfig:
        return cls()


class ToyFrameEncoder(BaseEncoder):
    def __init__(self, config: ToyFrameConfig):
        super().__init__()
        self.config = config
        self.streaming_kind = config.streaming_kind
        self.subsampling_rate = config.stride
        widths = config.widths
        self.input_proj = layers.Linear(config.input_dim * config.stride, widths[0])
        self.prompt = layers.Embedding(len(config.languages), widths[0])
        self.convs = torch.nn.ModuleList(layers.DepthwiseConv1d(w, k) for w, k in zip(widths, config.kernels,
                                                                                      strict=True))
        outs = (*widths[1:], widths[-1])
        self.projs = torch.nn.ModuleList(layers.LinearActivation(w, o, "relu") for w, o in zip(widths, outs,
                                                                                                 strict=True))
        self.streaming_state_specs = (
            *(StreamStateSpec(f"conv{i}", (1, k - 1, w)) for i, (w, k) in enumerate(zip(widths, config.kernels,
                                                                                      strict=True))),
            StreamStateSpec("prompt", (1,), dtype="int64", persistent=True),
        )

    @property
    def output_size(self) -> int:
        return self.config.widths[-1]

    def language_id(self, language: str | None) -> int:
        return 0 if language is None else self.config.languages.index(language)

    def streaming_geometry(self, chunk_size: int) -> StreamingGeometry:
        geometry = super().streaming_geometry(chunk_size)
        frames = chunk_size * self.config.stride  # stacking consumes whole groups, with no look-ahead
        return StreamingGeometry(geometry.chunk_size, frames, frames)

    def _stack(self, feats: torch.Tensor, lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.config.stride
        frames = feats.shape[1] // s
        x = feats - feats.mean(dim=-1, keepdim=True)
        x = x[:, : frames * s].reshape(feats.shape[0], frames, s * feats.shape[-1])
        return self.input_proj(x), torch.div(lens, s, rounding_mode="floor")

    def _layers(self, x: torch.Tensor, lens: torch.Tensor, prompts: torch.Tensor,
                tails: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Run the stack over ``x`` (B, C, w0) whose layer inputs are preceded by ``tails``; returns the
        output and each row's new tails (the last ``kernel - 1`` valid inputs of every layer)."""
        if x.shape[1] == 0:  # a final window shorter than one stacked frame
            return x.new_zeros(x.shape[0], 0, self.output_size), tails
        x = x + self.prompt(prompts)[:, None]
        new_tails = []
        for conv, proj, tail in zip(self.convs, self.projs, tails, strict=True):
            joined = torch.cat([tail.to(x.dtype), x], dim=1)
            keep = tail.shape[1]
            index = lens.view(-1, 1) + torch.arange(keep, device=x.device)
            new_tails.append(joined.gather(1, index[..., None].expand(-1, -1, joined.shape[-1])))
            x = proj(conv(joined))
        return x, new_tails

    def _zero_tails(self, batch: int, device: torch.device) -> list[torch.Tensor]:
        return [torch.zeros(batch, k - 1, w, device=device)
                for w, k in zip(self.config.widths, self.config.kernels, strict=True)]

    def forward(self, feats: torch.Tensor, lens: torch.Tensor, prompts: torch.Tensor | None = None):
        x, out_lens = self._stack(feats, lens)
        if prompts is None:
            prompts = torch.zeros(feats.shape[0], dtype=torch.long, device=feats.device)
        hidden, _ = self._layers(x, out_lens, prompts, self._zero_tails(feats.shape[0], feats.device))
        return hidden, out_lens

    # -- slot streaming --------------------------------------------------------------------------------
    def stream_request_state(self, options: Any) -> dict[str, torch.Tensor | float]:
        return {"prompt": self.language_id(options.language)}

    def forward_chunk_slots(self, feats, feat_lens, offsets, states):
        x, lens = self._stack(feats, feat_lens)
        tails = [states[f"conv{i}"] for i in range(len(self.convs))]
        hidden, new_tails = self._layers(x, lens, states["prompt"], tails)
        return hidden, lens, {f"conv{i}": t for i, t in enumerate(new_tails)}

    # -- stateful streaming ----------------------------------------------------------------------------
    def init_stream_state(self, batch_size: int, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
        state = {f"conv{i}": t for i, t in enumerate(self._zero_tails(batch_size, torch.device(device)))}
        state["prompt"] = torch.zeros(batch_size, dtype=torch.long, device=device)
        return state

    def forward_chunk_stateful(self, feats, state, *, feat_lens=None, required_cache_size=-1):
        if feat_lens is None:
            feat_lens = torch.full((feats.shape[0],), feats.shape[1], dtype=torch.long, device=feats.device)
        hidden, lens, tails = self.forward_chunk_slots(feats, feat_lens, None, state)
        return hidden, lens, {**state, **tails}


class ToyFrameModel(BaseAsrModel):
    """The toy encoder plus a frame classifier, decoded by the family's own ``framewise`` method."""

    config_class = ToyFrameConfig
    #: the encoder is prompted with the request's language
    encoder_options = frozenset({"language"})

    def __init__(self, config: ToyFrameConfig):
        super().__init__(config)
        self.encoder = ToyFrameEncoder(config)
        self.classifier = layers.Linear(config.widths[-1], config.vocab_size)

    @property
    def capabilities(self) -> frozenset[str]:
        return frozenset({"framewise"})

    def encode(self, feats: torch.Tensor, feat_lens: torch.Tensor, prompts: torch.Tensor | None = None):
        return self.encoder(feats, feat_lens, prompts)

    def encode_offline(self, feats, feat_lens):
        return self.encoder(feats, feat_lens)
