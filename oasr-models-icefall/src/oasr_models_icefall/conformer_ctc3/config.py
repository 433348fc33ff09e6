"""Configuration of icefall's ``conformer_ctc3`` (the ``icefall_conformer`` architecture).

Field names follow the recipe's ``train.py`` flags (``--encoder-dim``, ``--nhead``, ...) so a reader
who knows icefall recognises each knob.  Every field that changes the inference graph is recoverable
from a release's tensor shapes except ``causal``: a causal depthwise convolution has the same
weights as a centred one (it only pads on the left), so the converter keeps icefall's default.
"""

from __future__ import annotations

import attrs

from oasr.models import BaseModelConfig


@attrs.define(kw_only=True)
class ConformerCtcConfig(BaseModelConfig):
    """A ``conformer_ctc3`` CTC model: Conv2dSubsampling (÷4) + scaled Conformer layers + CTC head."""

    vocab_size: int
    feature_dim: int = 80
    encoder_dim: int = 512
    nhead: int = 8
    dim_feedforward: int = 2048
    num_encoder_layers: int = 12
    cnn_module_kernel: int = 31
    #: channels of the three Conv2dSubsampling convolutions (icefall's layer{1,2,3}_channels)
    subsampling_channels: tuple[int, int, int] = attrs.field(default=(8, 32, 128), converter=tuple)
    #: left-only padding of the depthwise convolution (``--causal-convolution``; not visible in shapes)
    causal: bool = False
    blank_id: int = 0

    def __attrs_post_init__(self) -> None:
        if self.encoder_dim % self.nhead:
            raise ValueError(f"encoder_dim {self.encoder_dim} is not divisible by nhead {self.nhead}")
        if self.cnn_module_kernel % 2 != 1:
            raise ValueError(f"cnn_module_kernel must be odd, got {self.cnn_module_kernel}")
        if self.feature_dim < 7:
            raise ValueError(f"feature_dim must be at least 7 for Conv2dSubsampling, got {self.feature_dim}")

    @property
    def head_dim(self) -> int:
        return self.encoder_dim // self.nhead

    @property
    def subsampled_feature_dim(self) -> int:
        """Frequency bins left after the two stride-2 convolutions: ((F - 1) // 2 - 1) // 2."""
        return ((self.feature_dim - 1) // 2 - 1) // 2

    @classmethod
    def tiny(cls) -> ConformerCtcConfig:
        return cls(vocab_size=12, feature_dim=20, encoder_dim=32, nhead=2, dim_feedforward=48,
                   num_encoder_layers=2, cnn_module_kernel=5, subsampling_channels=(4, 8, 16))
