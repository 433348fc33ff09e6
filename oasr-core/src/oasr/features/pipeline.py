"""``extract_features_batch``: the engine's single entry point from waveforms to model features.

In order: ``audio_scale``, the registered extractor of ``config.feature_type``, LFR stacking
(``lfr_m`` / ``lfr_n``), then ``config.normalize``.  Waveforms are float in [-1, 1] at
``config.sample_rate``: a list of 1-D tensors or arrays, or a padded (B, T) tensor with lengths.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import torch

from oasr.features.config import FeatureConfig
from oasr.features.lfr import apply_lfr_batch
from oasr.features.normalize import normalize_features
from oasr.features.registry import FeatureExtractor, build_extractor

_extractors: dict[tuple, FeatureExtractor] = {}
_lock = threading.Lock()


def extractor_for(config: FeatureConfig) -> FeatureExtractor:
    """The (cached) :class:`FeatureExtractor` serving ``config``."""
    key = config.cache_key()
    extractor = _extractors.get(key)
    if extractor is None:
        with _lock:
            extractor = _extractors.setdefault(key, build_extractor(config))
    return extractor


def pad_waveforms(waveforms: Sequence[torch.Tensor | np.ndarray],
                  device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A list of 1-D waveforms → (B, T) float32 zero-padded batch and (B,) lengths."""
    rows = [torch.as_tensor(w).reshape(-1) if not isinstance(w, torch.Tensor) else w.reshape(-1) for w in waveforms]
    if device is None:
        device = rows[0].device if rows else "cpu"
    lengths = torch.tensor([r.numel() for r in rows], dtype=torch.long)
    padded = torch.zeros(len(rows), int(lengths.max()) if rows else 0, device=device)
    for i, row in enumerate(rows):
        padded[i, :row.numel()] = row.to(device=device, dtype=torch.float32)
    return padded, lengths


def extract_features_batch(
    waveforms: Sequence[torch.Tensor | np.ndarray] | torch.Tensor,
    config: FeatureConfig,
    lengths: torch.Tensor | Sequence[int] | None = None,
    *,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Waveforms → (features (B, T', config.output_dim) float32, feature lengths (B,) long)."""
    if isinstance(waveforms, torch.Tensor):
        padded = waveforms if waveforms.dim() == 2 else waveforms.reshape(1, -1)
        padded = padded.to(device=device if device is not None else padded.device, dtype=torch.float32)
        if lengths is None:
            lengths = torch.full((padded.shape[0],), padded.shape[1], dtype=torch.long)
        lengths = torch.as_tensor(lengths, dtype=torch.long).reshape(-1).cpu()
    else:
        if lengths is not None:
            raise ValueError("lengths are taken from the waveforms when a list is given")
        padded, lengths = pad_waveforms(waveforms, device)
    if config.audio_scale != 1.0:
        padded = padded * config.audio_scale
    feats, feat_lengths = extractor_for(config)(padded, lengths)
    feat_lengths = torch.as_tensor(feat_lengths, dtype=torch.long).reshape(-1)
    if config.lfr_m != 1 or config.lfr_n != 1:
        feats, feat_lengths = apply_lfr_batch(feats, feat_lengths, config.lfr_m, config.lfr_n)
    feats = normalize_features(feats, feat_lengths, config)
    return feats.float(), feat_lengths.cpu()
