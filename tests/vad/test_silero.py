"""The VAD against faster-whisper's: the same model file and options give the same speech spans, to the sample."""

from __future__ import annotations

import math

import numpy as np
import pytest

from oasr.vad import SileroVad, VadOptions, default_model_path, get_speech_timestamps, speech_spans

OPTION_SETS = [
    {},
    {"min_silence_duration_ms": 500, "speech_pad_ms": 200},
    {"min_silence_duration_ms": 100, "speech_pad_ms": 30, "min_speech_duration_ms": 250},
    {"threshold": 0.6, "neg_threshold": 0.3, "min_silence_duration_ms": 300},
    {"max_speech_duration_s": 3.0, "min_silence_duration_ms": 1000},
    {"max_speech_duration_s": 1.5, "min_silence_duration_ms": 50, "speech_pad_ms": 0},
]


def _faster_whisper_vad():
    try:
        from faster_whisper import vad
    except ImportError:
        pytest.fail("faster-whisper (the VAD oracle) is not installed: pip install faster-whisper")
    return vad


def _reference_spans(audio, options: dict) -> list[tuple[int, int]]:
    vad = _faster_whisper_vad()
    return [(s["start"], s["end"]) for s in vad.get_speech_timestamps(audio, vad.VadOptions(**options))]


def test_model_file_is_faster_whispers():
    from pathlib import Path

    vad = _faster_whisper_vad()
    assert default_model_path().resolve() == (Path(vad.get_assets_path()) / "silero_vad_v6.onnx").resolve()


def test_probabilities_equal_faster_whisper(recording):
    vad = _faster_whisper_vad()
    audio = recording.audio
    padded = np.pad(audio, (0, 512 - len(audio) % 512))
    expected = vad.get_vad_model()(padded.copy())
    ours = SileroVad().probabilities(audio)
    assert ours.shape == expected.shape
    np.testing.assert_array_equal(ours, expected)
    assert (ours > 0.5).mean() > 0.3 and (ours < 0.35).mean() > 0.2  # speech and silence both present


@pytest.mark.parametrize("options", OPTION_SETS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "defaults")
def test_spans_equal_faster_whisper(recording, options):
    ours = [(s.start, s.end) for s in get_speech_timestamps(recording.audio, VadOptions(**options))]
    expected = _reference_spans(recording.audio, options)
    assert ours == expected
    assert len(expected) >= 2


def test_spans_on_lengths_around_a_window(clips):
    """Audio lengths that are, or nearly are, multiples of 512 (the padded last window)."""
    _, speech = clips[1]
    for extra in (0, 1, 63, 64, 65, 511):
        n = 512 * 60 + extra
        audio = np.concatenate([np.zeros(8000, np.float32), speech])[:n]
        options = {"min_silence_duration_ms": 200, "speech_pad_ms": 100}
        ours = [(s.start, s.end) for s in get_speech_timestamps(audio, VadOptions(**options))]
        assert ours == _reference_spans(audio, options), extra


def test_spans_cover_every_sentence(recording):
    spans = get_speech_timestamps(recording.audio, VadOptions(min_silence_duration_ms=100, speech_pad_ms=100))
    inside = np.zeros(len(recording.audio), bool)
    for s in spans:
        inside[s.start:s.end] = True
    speech = np.zeros(len(recording.audio), bool)
    for start, end in recording.spans:
        speech[start:end] = True
        assert inside[start:end].mean() > 0.7, (start, end)  # espeak clips carry their own edge silence
    assert inside[~speech].mean() < 0.25  # the long silences are not speech


def test_machine_on_synthetic_probabilities():
    """Rules checked on hand-made probabilities against the oracle's state machine fed the same values."""
    vad = _faster_whisper_vad()
    rng = np.random.default_rng(0)
    pattern = np.repeat(rng.random(400) > 0.5, rng.integers(1, 40, 400))[:6000]
    probs = np.where(pattern, rng.uniform(0.3, 1.0, pattern.size), rng.uniform(0.0, 0.55, pattern.size))
    probs = probs.astype(np.float32)

    class Fixed:
        def __call__(self, audio):
            return probs[: len(audio) // 512]

    original = vad.get_vad_model
    vad.get_vad_model = lambda: Fixed()
    try:
        for options in OPTION_SETS + [{"max_speech_duration_s": 0.5, "min_speech_duration_ms": 100}]:
            n = 512 * len(probs) - 7
            ref = [(s["start"], s["end"]) for s in vad.get_speech_timestamps(np.zeros(n, np.float32),
                                                                           vad.VadOptions(**options))]
            ours = [(s.start, s.end) for s in speech_spans(probs, n, VadOptions(**options))]
            assert ours == ref, options
    finally:
        vad.get_vad_model = original


def test_stream_equals_offline(recording):
    vad = SileroVad()
    audio = recording.audio[: 512 * 400]
    offline = vad.probabilities(audio)[:400]
    stream = vad.stream()
    rng = np.random.default_rng(1)
    got, pos = [], 0
    while pos < len(audio):
        step = int(rng.integers(100, 3000))
        got.append(stream.push(audio[pos:pos + step]))
        pos += step
    streamed = np.concatenate(got)
    assert streamed.shape == (400,)
    np.testing.assert_allclose(streamed, offline, atol=1e-5)


def test_options_validate():
    with pytest.raises(ValueError, match="threshold"):
        VadOptions(threshold=1.5)
    with pytest.raises(ValueError):
        VadOptions(min_silence_duration_ms=-1)
    assert VadOptions().max_speech_duration_s == math.inf
    assert VadOptions(threshold=0.1).silence_threshold == 0.01


def test_other_sample_rates_are_refused():
    from oasr.errors import OasrError

    with pytest.raises(OasrError, match="16000 Hz"):
        get_speech_timestamps(np.zeros(8000, np.float32), sample_rate=8000)
