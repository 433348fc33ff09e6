"""BatchedStreamingFeatureExtractor: any chunking of a signal gives exactly the offline features."""

from __future__ import annotations

import random

import pytest
import torch

from oasr.errors import CapabilityError
from oasr.features import BatchedStreamingFeatureExtractor, FeatureConfig, extract_features_batch

STREAMABLE = [
    FeatureConfig(),
    FeatureConfig(audio_scale=32768.0, window_type="hamming", use_energy=True),
    FeatureConfig(feature_type="kaldi_mfcc", num_mel_bins=23, use_energy=True, audio_scale=32768.0),
    FeatureConfig(sample_rate=8000, num_mel_bins=23, frame_length_ms=20.0, frame_shift_ms=7.5),
    FeatureConfig(num_mel_bins=40, use_energy=True, energy_floor=1.0, window_type="blackman"),
    FeatureConfig(feature_type="kaldi_mfcc", num_mel_bins=30, num_ceps=5, cepstral_lifter=0.0),
    FeatureConfig(feature_type="nemotron_logmel"),
    FeatureConfig(feature_type="nemotron_logmel", preemphasis=0.0),
    FeatureConfig(feature_type="nemotron_logmel", num_mel_bins=128, options={"mel_filters_dtype": "bfloat16"}),
]


def _stream(config: FeatureConfig, rows: list[torch.Tensor], seed: int,
            extractor: BatchedStreamingFeatureExtractor | None = None) -> list[torch.Tensor]:
    """Feed every row in random chunk sizes, random subsets of slots per call, then flush."""
    rng = random.Random(seed)
    extractor = extractor or BatchedStreamingFeatureExtractor(config, batch_size=len(rows))
    pieces: list[list[torch.Tensor]] = [[] for _ in rows]
    position = [0] * len(rows)
    while any(p < r.numel() for p, r in zip(position, rows, strict=True)):
        slots = [i for i, r in enumerate(rows) if position[i] < r.numel() and rng.random() < 0.7]
        if not slots:
            continue
        chunks = []
        for i in slots:
            size = rng.choice([1, 2, 7, 159, 160, 161, 333, 512, 1600, 4001])
            chunks.append(rows[i][position[i]:position[i] + size])
            position[i] += size
        for i, frames in zip(slots, extractor.process_chunk(slots, chunks), strict=True):
            assert frames.shape[1] == config.output_dim
            pieces[i].append(frames)
    for i, frames in enumerate(extractor.flush(list(range(len(rows))))):
        pieces[i].append(frames)
    return [torch.cat(p) for p in pieces]


@pytest.mark.parametrize("config", STREAMABLE, ids=lambda c: f"{c.feature_type}-{c.sample_rate}-{c.num_mel_bins}")
@pytest.mark.parametrize("seed", [0, 1])
def test_random_chunkings_equal_offline_exactly(signal, config, seed):
    rows = [signal(int(config.sample_rate * s), config.sample_rate, seed=i)
            for i, s in enumerate((1.0, 0.3472, 0.06, 0.0001))]
    offline, lengths = extract_features_batch(rows, config)
    for i, streamed in enumerate(_stream(config, rows, seed)):
        expected = offline[i, :int(lengths[i])]
        assert streamed.shape == expected.shape
        assert torch.equal(streamed, expected), float((streamed - expected).abs().max())


@pytest.mark.parametrize("config", [
    FeatureConfig(snip_edges=False, high_freq=-400.0),  # lhotse / icefall
    FeatureConfig(feature_type="kaldi_mfcc", snip_edges=False, num_mel_bins=23, use_energy=True),
    FeatureConfig(snip_edges=False, sample_rate=8000, num_mel_bins=23, frame_length_ms=20.0, frame_shift_ms=7.5),
], ids=lambda c: f"{c.feature_type}-{c.sample_rate}")
@pytest.mark.parametrize("seed", [0, 1])
def test_mirrored_edges_stream_exactly(signal, config, seed):
    """snip_edges=False (Kaldi reflects the signal at both ends): streams of every length, including
    ones shorter than the mirrored start (framed whole at the flush), equal offline exactly."""
    mirror = config.frame_length // 2 - config.frame_shift // 2
    sizes = (16000, 5555, 1, mirror - 20, mirror, mirror + 81, 2 * mirror + 41)
    rows = [signal(n, config.sample_rate, seed=i) for i, n in enumerate(sizes)]
    offline, lengths = extract_features_batch(rows, config)
    assert int(lengths[2]) == 0 and int(lengths[3]) >= 1  # a frame before the mirrored start is complete
    for i, streamed in enumerate(_stream(config, rows, seed)):
        expected = offline[i, :int(lengths[i])]
        assert streamed.shape == expected.shape
        assert torch.equal(streamed, expected), float((streamed - expected).abs().max())


def test_a_slot_is_reused_after_flush_and_reset(signal):
    config = FeatureConfig(feature_type="nemotron_logmel")
    extractor = BatchedStreamingFeatureExtractor(config, batch_size=2)
    first, second = signal(7000, seed=1), signal(5000, seed=2)
    offline, lengths = extract_features_batch([first, second], config)
    got_first = _stream(config, [first, second], 3, extractor)
    assert extractor.frames_emitted(0) == 0 and extractor.samples_seen(0) == 0
    extractor.process_chunk(0, second[:1234])
    extractor.reset(0)
    got_second = _stream(config, [second, first], 4, extractor)
    assert torch.equal(got_first[0], offline[0, :int(lengths[0])])
    assert torch.equal(got_second[0], offline[1, :int(lengths[1])])


def test_single_slot_calls_return_a_tensor(signal):
    config = FeatureConfig()
    extractor = BatchedStreamingFeatureExtractor(config, batch_size=3)
    audio = signal(4000)
    frames = extractor.process_chunk(2, audio)
    assert isinstance(frames, torch.Tensor) and frames.shape == (1 + (4000 - 400) // 160, 80)
    assert extractor.flush(2).shape == (0, 80)
    with pytest.raises(IndexError):
        extractor.process_chunk(3, audio)
    with pytest.raises(ValueError, match="repeat"):
        extractor.process_chunk([1, 1], [audio, audio])


@pytest.mark.parametrize("config, reason", [
    (FeatureConfig(feature_type="whisper_logmel", window_seconds=30.0), "whisper_logmel"),
    (FeatureConfig(lfr_m=7, lfr_n=6), "LFR"),
    (FeatureConfig(feature_type="nemotron_logmel", normalize="per_feature"), "per_feature"),
])
def test_unstreamable_configs_are_refused_at_construction(config, reason):
    with pytest.raises(CapabilityError, match=reason):
        BatchedStreamingFeatureExtractor(config, batch_size=1)


def test_workspaces_made_under_inference_mode_serve_later_calls():
    """A batch computed inside torch.inference_mode (as the engine does) must not poison the cached
    workspaces for a later call outside it."""
    from oasr.features import FeatureConfig, extract_features_batch

    config = FeatureConfig(feature_type="kaldi_fbank", num_mel_bins=23)
    wave = [torch.sin(torch.arange(8000) * 0.05)]
    with torch.inference_mode():
        first, _ = extract_features_batch(wave, config)
    second, _ = extract_features_batch(wave, config)
    assert torch.equal(first, second)
