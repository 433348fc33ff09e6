"""icefall's ``Conv2dSubsampling`` (``encoder_embed``): three convolutions, a ConvNeXt block, a
projection and a BiasNorm.  T feature frames become ``(T - 7) // 2`` embed frames (the encoder
halves that again at its output: 4 feature frames per output frame in all)."""

from __future__ import annotations

import torch
from torch import nn

from oasr import layers
from oasr_models_icefall.zipformer.scaling import BiasNorm, SwooshL, SwooshR


class ConvNeXt(nn.Module):
    """Depthwise 7x7 → pointwise ×3 → SwooshL → pointwise, added to its input; (N, C, T, F)."""

    def __init__(self, channels: int, hidden_ratio: int = 3, kernel_size: tuple[int, int] = (7, 7)):
        super().__init__()
        self.padding = ((kernel_size[0] - 1) // 2, (kernel_size[1] - 1) // 2)
        hidden = channels * hidden_ratio
        self.depthwise_conv = layers.Conv2d(channels, channels, kernel_size, padding=self.padding, groups=channels)
        self.pointwise_conv1 = layers.Conv2d(channels, hidden, 1)
        self.activation = SwooshL()
        self.pointwise_conv2 = layers.Conv2d(hidden, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bypass = x
        x = self.depthwise_conv(x)
        x = self.pointwise_conv1(x)
        x = self.activation(x)
        x = self.pointwise_conv2(x)
        return bypass + x


class Conv2dSubsampling(nn.Module):
    """(N, T, in_channels) features → (N, (T - 7) // 2, out_channels).

    ``conv`` keeps icefall's ``nn.Sequential`` indices (0, 4, 7 are the convolutions; the others
    are training-only balancers and the activations), so checkpoint keys match.
    """

    def __init__(self, in_channels: int, out_channels: int, layer1_channels: int = 8, layer2_channels: int = 32,
                 layer3_channels: int = 128):
        super().__init__()
        if in_channels < 7:
            raise ValueError(f"Conv2dSubsampling needs at least 7 feature bins, got {in_channels}")
        self.conv = nn.Sequential(
            layers.Conv2d(1, layer1_channels, 3, padding=(0, 1)),
            nn.Identity(),  # ScaleGrad
            nn.Identity(),  # Balancer
            SwooshR(),
            layers.Conv2d(layer1_channels, layer2_channels, 3, stride=2),
            nn.Identity(),  # Balancer
            SwooshR(),
            layers.Conv2d(layer2_channels, layer3_channels, 3, stride=(1, 2)),
            nn.Identity(),  # Balancer
            SwooshR(),
        )
        self.convnext = ConvNeXt(layer3_channels)
        self.out_width = (((in_channels - 1) // 2) - 1) // 2
        self.layer3_channels = layer3_channels
        self.out = layers.Linear(self.out_width * layer3_channels, out_channels)
        self.out_norm = BiasNorm(out_channels)

    def forward(self, x: torch.Tensor, x_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.conv(x.unsqueeze(1))
        x = self.convnext(x)
        b, c, t, f = x.shape
        x = self.out(x.transpose(1, 2).reshape(b, t, c * f))
        x = self.out_norm(x)
        return x, (x_lens - 7) // 2
