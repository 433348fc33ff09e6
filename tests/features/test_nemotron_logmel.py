"""nemotron_logmel against the feature extractors transformers' NeMo-family processors use:
nemotron_asr_streaming and nemotron3_5_asr (NemotronAsrStreamingFeatureExtractor, the latter with
bfloat16 filter constants) and parakeet_ctc (ParakeetFeatureExtractor, = nemotron_logmel followed by
per-feature normalization)."""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers.models.auto.feature_extraction_auto import FEATURE_EXTRACTOR_MAPPING_NAMES

from oasr.features import FeatureConfig, extract_features_batch

pytestmark = pytest.mark.reference


def _extractor_of(model_type: str, **kwargs):
    """The feature extractor class transformers pairs with ``model_type``, built with tiny/default args."""
    return getattr(transformers, FEATURE_EXTRACTOR_MAPPING_NAMES[model_type])(**kwargs)


@pytest.fixture
def rows(signal):
    return [signal(n, seed=i) for i, n in enumerate((16000, 12345, 40000, 161))]


@pytest.mark.parametrize("model_type, options", [
    ("nemotron_asr_streaming_encoder", {}),
    ("nemotron3_5_asr", {}),
    ("nemotron3_5_asr", {"mel_filters_dtype": "bfloat16"}),
])
def test_matches_nemotron_feature_extractors(rows, model_type, options):
    ref = _extractor_of(model_type, **options)([r.numpy() for r in rows], sampling_rate=16000, return_tensors="pt")
    ours, lens = extract_features_batch(rows, FeatureConfig(feature_type="nemotron_logmel", options=options))
    assert lens.tolist() == ref.attention_mask.sum(1).tolist() == [r.numel() // 160 for r in rows]
    width = ours.shape[1]
    torch.testing.assert_close(ours, ref.input_features[:, :width], rtol=0, atol=5e-6)
    assert not ref.input_features[:, width:].any()


def test_bfloat16_constants_change_the_features(rows):
    f32, _ = extract_features_batch(rows, FeatureConfig(feature_type="nemotron_logmel"))
    bf16, _ = extract_features_batch(rows, FeatureConfig(feature_type="nemotron_logmel",
                                                         options={"mel_filters_dtype": "bfloat16"}))
    assert (f32 - bf16).abs().max() > 1e-3


def test_parakeet_ctc_is_nemotron_logmel_then_per_feature_normalization(rows):
    rows = rows[:3]  # transformers divides by (frames - 1): a one-frame row is NaN there, finite here
    parakeet = _extractor_of("parakeet_ctc")
    assert type(parakeet).__name__ == "ParakeetFeatureExtractor"
    ref = parakeet([r.numpy() for r in rows], sampling_rate=16000, return_tensors="pt")
    ours, lens = extract_features_batch(rows, FeatureConfig(feature_type="nemotron_logmel", normalize="per_feature"))
    width = ours.shape[1]
    torch.testing.assert_close(ours, ref.input_features[:, :width], rtol=0, atol=5e-5)
    # before its normalization: parakeet's own spectrogram stage on its own pre-emphasised input
    raw, _ = extract_features_batch(rows, FeatureConfig(feature_type="nemotron_logmel"))
    padded = torch.zeros(len(rows), max(r.numel() for r in rows))
    for i, r in enumerate(rows):
        padded[i, :r.numel()] = r
        padded[i, 1:r.numel()] = r[1:] - 0.97 * r[:-1]
    spectrogram = parakeet._torch_extract_fbank_features(padded)
    for i in range(len(rows)):
        n = int(lens[i])
        torch.testing.assert_close(raw[i, :n], spectrogram[i, :n], rtol=0, atol=5e-6)
