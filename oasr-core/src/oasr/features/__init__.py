"""Feature frontends: waveforms in [-1, 1] → model input features, batched, as a registry axis.

A frontend is a registered :class:`ExtractorSpec` selected by :attr:`FeatureConfig.feature_type`; the
engine builds the config from the checkpoint's :class:`oasr.models.FeatureSpec`
(:meth:`FeatureConfig.from_spec`) and calls :func:`extract_features_batch` (offline) or drives a
:class:`BatchedStreamingFeatureExtractor` (streaming).  Built in: ``kaldi_fbank``, ``kaldi_mfcc``,
``whisper_logmel``, ``nemotron_logmel``; LFR stacking and normalization are post-transforms.

Importing this package imports nothing else: every name loads on first use (so the built-in
frontends can be declared, :mod:`oasr.features.extractors`, while the plugin registry is filling).
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "FeatureConfig": "oasr.features.config",
    "ExtractorSpec": "oasr.features.spec",
    "StreamingFraming": "oasr.features.spec",
    "FeatureExtractor": "oasr.features.registry",
    "build_extractor": "oasr.features.registry",
    "get_extractor_spec": "oasr.features.registry",
    "list_extractors": "oasr.features.registry",
    "register_extractor": "oasr.features.registry",
    "unregister_extractor": "oasr.features.registry",
    "extract_features_batch": "oasr.features.pipeline",
    "pad_waveforms": "oasr.features.pipeline",
    "BatchedStreamingFeatureExtractor": "oasr.features.streaming",
    "apply_lfr_batch": "oasr.features.lfr",
    "normalize_features": "oasr.features.normalize",
    "batched_fbank": "oasr.features.batched",
    "batched_mfcc": "oasr.features.batched",
    "batched_whisper_logmel": "oasr.features.whisper",
    "batched_nemotron_logmel": "oasr.features.nemotron",
}

__all__ = [
    "BatchedStreamingFeatureExtractor", "ExtractorSpec", "FeatureConfig", "FeatureExtractor", "StreamingFraming",
    "apply_lfr_batch", "batched_fbank", "batched_mfcc", "batched_nemotron_logmel", "batched_whisper_logmel",
    "build_extractor", "extract_features_batch", "get_extractor_spec", "list_extractors", "normalize_features",
    "pad_waveforms", "register_extractor", "unregister_extractor",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'oasr.features' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
