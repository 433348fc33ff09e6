"""Configuration of icefall's Zipformer2 (``zipformer`` architecture).

Field names are icefall's ``train.py`` flags (``--encoder-dim`` → ``encoder_dim``), one value per
stack.  The converter infers every field from checkpoint shapes; ``chunk_size`` and
``left_context_frames`` (embed frames, 50 per second) are the decode geometry of a causal release —
icefall's published one, chunk 16 / left context 128, unless the user overrides it.
"""

from __future__ import annotations

import attrs

from oasr.models import BaseModelConfig

#: the decode geometry causal Zipformer releases are published at (embed frames)
RELEASE_CHUNK_SIZE = 16
RELEASE_LEFT_CONTEXT_FRAMES = 128


def _ints(value) -> tuple[int, ...]:
    return tuple(int(v) for v in value)


@attrs.define(kw_only=True)
class ZipformerEncoderConfig:
    """Zipformer2 + its Conv2dSubsampling front-end (``encoder_embed``)."""

    feature_dim: int = 80
    #: channels of encoder_embed's three convolutions (icefall's Conv2dSubsampling defaults)
    embed_channels: tuple[int, ...] = attrs.field(default=(8, 32, 128), converter=_ints)
    downsampling_factor: tuple[int, ...] = attrs.field(default=(1, 2, 4, 8, 4, 2), converter=_ints)
    num_encoder_layers: tuple[int, ...] = attrs.field(default=(2, 2, 3, 4, 3, 2), converter=_ints)
    encoder_dim: tuple[int, ...] = attrs.field(default=(192, 256, 384, 512, 384, 256), converter=_ints)
    num_heads: tuple[int, ...] = attrs.field(default=(4, 4, 4, 8, 4, 4), converter=_ints)
    query_head_dim: tuple[int, ...] = attrs.field(default=(32,) * 6, converter=_ints)
    value_head_dim: tuple[int, ...] = attrs.field(default=(12,) * 6, converter=_ints)
    pos_head_dim: tuple[int, ...] = attrs.field(default=(4,) * 6, converter=_ints)
    pos_dim: int = 48
    feedforward_dim: tuple[int, ...] = attrs.field(default=(512, 768, 1024, 1536, 1024, 768), converter=_ints)
    cnn_module_kernel: tuple[int, ...] = attrs.field(default=(31, 31, 15, 15, 15, 31), converter=_ints)
    output_downsampling_factor: int = 2
    causal: bool = False
    #: offline chunk mask (and streaming chunk) of a causal model, in embed frames; -1: none
    chunk_size: int = RELEASE_CHUNK_SIZE
    #: left context of the chunk mask in embed frames (rounded down to whole chunks, at least one)
    left_context_frames: int = RELEASE_LEFT_CONTEXT_FRAMES

    def __attrs_post_init__(self) -> None:
        stacks = len(self.downsampling_factor)
        for field in ("num_encoder_layers", "encoder_dim", "num_heads", "query_head_dim", "value_head_dim",
                      "pos_head_dim", "feedforward_dim", "cnn_module_kernel"):
            if len(getattr(self, field)) != stacks:
                raise ValueError(f"{field} has {len(getattr(self, field))} values for {stacks} stacks")
        if self.causal and self.chunk_size > 0:
            bad = [d for d in self.downsampling_factor if self.chunk_size % d]
            if bad:
                raise ValueError(f"chunk_size {self.chunk_size} must be a multiple of every downsampling factor "
                                 f"(not of {bad})")

    @property
    def output_size(self) -> int:
        return max(self.encoder_dim)


@attrs.define(kw_only=True)
class ZipformerCtcModelConfig(BaseModelConfig):
    """A Zipformer2 encoder with icefall's CTC head (``ctc_output``)."""

    vocab_size: int
    encoder: ZipformerEncoderConfig
    blank_id: int = 0

    @classmethod
    def tiny(cls) -> ZipformerCtcModelConfig:
        encoder = ZipformerEncoderConfig(
            feature_dim=20, embed_channels=(4, 8, 16), downsampling_factor=(1, 2), num_encoder_layers=(1, 1),
            encoder_dim=(16, 24),
            num_heads=(2, 2), query_head_dim=(4, 4), value_head_dim=(4, 4), pos_head_dim=(2, 2), pos_dim=8,
            feedforward_dim=(24, 32), cnn_module_kernel=(5, 3), causal=True, chunk_size=4, left_context_frames=8)
        return cls(vocab_size=16, encoder=encoder)
