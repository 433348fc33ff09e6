"""Feature normalization a checkpoint's FeatureSpec declares (``FeatureConfig.normalize``).

- ``"per_feature"``: per utterance and feature, over the row's valid frames, ``(x - mean) / (std + 1e-5)``
  with the unbiased std — NeMo's ``normalize="per_feature"`` as transformers' Parakeet extractor computes it.
- ``"cmvn"``: a fixed global affine map ``(x - options["cmvn_mean"]) * options["cmvn_istd"]`` (FunASR's
  ``am.mvn`` is ``mean = -AddShift``, ``istd = Rescale``).

Frames past a row's length are 0 afterwards.
"""

from __future__ import annotations

import torch

from oasr.errors import ConfigError
from oasr.features.config import FeatureConfig

PER_FEATURE_EPS = 1e-5


def per_feature_normalize(feats: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    mask = (torch.arange(feats.shape[1], device=feats.device)[None, :] < lengths.to(feats.device)[:, None])[..., None]
    count = lengths.to(feats.device, feats.dtype)[:, None]
    masked = feats * mask
    mean = (masked.sum(dim=1) / count.clamp_min(1))[:, None, :]
    variance = ((masked - mean) ** 2 * mask).sum(dim=1) / (count - 1).clamp_min(1)
    std = torch.sqrt(variance)[:, None, :]
    return (feats - mean) / (std + PER_FEATURE_EPS) * mask


def cmvn_normalize(feats: torch.Tensor, lengths: torch.Tensor, mean: torch.Tensor, istd: torch.Tensor) -> torch.Tensor:
    mask = (torch.arange(feats.shape[1], device=feats.device)[None, :] < lengths.to(feats.device)[:, None])[..., None]
    return (feats - mean) * istd * mask


def normalize_features(feats: torch.Tensor, lengths: torch.Tensor, config: FeatureConfig) -> torch.Tensor:
    """Apply ``config.normalize`` to (B, T, F) features (after LFR)."""
    if config.normalize is None:
        return feats
    if config.normalize == "per_feature":
        return per_feature_normalize(feats, lengths)
    mean = torch.as_tensor(config.options["cmvn_mean"], dtype=torch.float32, device=feats.device).reshape(-1)
    istd = torch.as_tensor(config.options["cmvn_istd"], dtype=torch.float32, device=feats.device).reshape(-1)
    if mean.numel() != feats.shape[-1] or istd.numel() != feats.shape[-1]:
        raise ConfigError(f"cmvn statistics have {mean.numel()} / {istd.numel()} values for features of "
                          f"dimension {feats.shape[-1]}", key="options")
    return cmvn_normalize(feats, lengths, mean, istd)
