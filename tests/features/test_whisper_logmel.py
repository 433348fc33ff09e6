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


def test_long_recording_log_mel_in_blocks_matches_openai_whisper(signal, monkeypatch):
    """A recording longer than one source block (100 s: 10,000 frames) with openai-whisper's 30 s padding:
    equal to ``log_mel_spectrogram(audio, padding=...)``, and the reflected source is never made whole
    (each block at most SOURCE_BLOCK_FRAMES frames of samples) nor the padding copied onto the audio."""
    import oasr.features.whisper as whisper_features

    widths = []
    reflect = whisper_features.reflect_rows

    def recording(x, lengths, left, width, **kwargs):
        widths.append((x.shape[1], width))
        return reflect(x, lengths, left, width, **kwargs)

    monkeypatch.setattr(whisper_features, "reflect_rows", recording)
    audio = signal(16000 * 100 + 77, seed=6)
    ref = whisper.log_mel_spectrogram(audio, 80, padding=N_SAMPLES)
    ours = log_mel(audio.numpy(), 80, N_SAMPLES)
    assert ours.shape == ref.shape == (80, (audio.numel() + N_SAMPLES) // 160)
    torch.testing.assert_close(ours, ref, rtol=0, atol=5e-7)
    block = whisper_features.SOURCE_BLOCK_FRAMES
    assert len(widths) == -(-ref.shape[1] // block) >= 2
    assert all(n == audio.numel() and width <= (block - 1) * 160 + 400 for n, width in widths)


def test_padding_samples_equal_zeros_appended(signal):
    """Rows of different lengths (one shorter than half an FFT) with ``padding_samples``: bit-equal to
    each row with the zeros written after it."""
    from oasr.features.whisper import SOURCE_BLOCK_FRAMES, whisper_logmel

    lengths = [SOURCE_BLOCK_FRAMES * 160 + 4321, 150, 48000]
    batch = torch.zeros(len(lengths), max(lengths))
    for i, n in enumerate(lengths):
        batch[i, :n] = signal(n, seed=10 + i)
    pad = 3000
    got, got_n = whisper_logmel(batch, torch.tensor(lengths), padding_samples=pad)
    for i, n in enumerate(lengths):
        row = torch.nn.functional.pad(batch[i, :n], (0, pad))[None]
        want, want_n = whisper_logmel(row, torch.tensor([n + pad]))
        assert int(got_n[i]) == int(want_n[0]) == (n + pad) // 160
        assert torch.equal(got[i, :int(got_n[i])], want[0])
        assert not got[i, int(got_n[i]):].any()
    with pytest.raises(ValueError, match="padding_samples"):
        whisper_logmel(batch, torch.tensor(lengths), padding_samples=pad, window_samples=480000)
