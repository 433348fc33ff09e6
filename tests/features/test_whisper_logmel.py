"""whisper_logmel against transformers' WhisperFeatureExtractor and openai-whisper's log_mel_spectrogram."""

from __future__ import annotations

import pytest
import torch
import whisper
from transformers import WhisperFeatureExtractor

from oasr.errors import CapabilityError
from oasr.features import BatchedStreamingFeatureExtractor, FeatureConfig, extract_features_batch
from oasr.features.whisper import log_mel

pytestmark = pytest.mark.reference
N_SAMPLES = 480000  # 30 s at 16 kHz


@pytest.fixture
def rows(signal):
    return [signal(n, seed=i) for i, n in enumerate((16000, 12345, 40001, 500000))]


@pytest.mark.parametrize("n_mels", [80, 128])
def test_thirty_second_window_matches_transformers(rows, n_mels):
    cfg = FeatureConfig(feature_type="whisper_logmel", num_mel_bins=n_mels, window_seconds=30.0)
    ours, lens = extract_features_batch(rows, cfg)
    hf = WhisperFeatureExtractor(feature_size=n_mels)(
        [r.numpy() for r in rows], sampling_rate=16000, return_tensors="pt", return_attention_mask=True)
    assert ours.shape == (len(rows), 3000, n_mels) and cfg.fixed_window_frames == 3000
    torch.testing.assert_close(ours.transpose(1, 2), hf.input_features, rtol=0, atol=5e-7)
    assert lens.tolist() == hf.attention_mask.sum(1).tolist() == [100, 78, 251, 3000]


@pytest.mark.parametrize("n_mels", [80, 128])
def test_thirty_second_window_matches_openai_whisper(rows, n_mels):
    cfg = FeatureConfig(feature_type="whisper_logmel", num_mel_bins=n_mels, window_seconds=30.0)
    ours, _ = extract_features_batch(rows, cfg)
    for i, row in enumerate(rows):
        ref = whisper.log_mel_spectrogram(whisper.pad_or_trim(row), n_mels)
        torch.testing.assert_close(ours[i].t(), ref, rtol=0, atol=5e-7)


@pytest.mark.parametrize("n_mels", [80, 128])
def test_long_form_log_mel_matches_openai_whisper(signal, n_mels):
    audio = signal(16000 * 7 + 123, seed=5)
    ref = whisper.log_mel_spectrogram(audio, n_mels, padding=N_SAMPLES)
    ours = log_mel(audio.numpy(), n_mels, N_SAMPLES)
    assert ours.shape == ref.shape == (n_mels, (audio.numel() + N_SAMPLES) // 160)
    torch.testing.assert_close(ours, ref, rtol=0, atol=5e-7)


def test_without_a_window_each_row_is_its_own_log_mel(rows):
    cfg = FeatureConfig(feature_type="whisper_logmel", window_seconds=None)
    assert cfg.fixed_window_seconds is None and cfg.fixed_window_frames is None
    ours, lens = extract_features_batch(rows, cfg)
    for i, row in enumerate(rows):
        ref = whisper.log_mel_spectrogram(row, 80)
        assert int(lens[i]) == ref.shape[1] == row.numel() // 160
        torch.testing.assert_close(ours[i, :int(lens[i])].t(), ref, rtol=0, atol=5e-7)
        assert not ours[i, int(lens[i]):].any()


def test_whisper_refuses_streaming():
    cfg = FeatureConfig(feature_type="whisper_logmel", window_seconds=30.0)
    assert not cfg.extractor_spec().supports_streaming
    with pytest.raises(CapabilityError, match="whisper_logmel"):
        BatchedStreamingFeatureExtractor(cfg, batch_size=2)
