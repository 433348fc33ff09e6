"""SRT and VTT of a multi-segment Whisper transcript, read back by independent parsers (``srt``,
``webvtt-py``) and checked against the segments' own times and texts."""

from __future__ import annotations

import io

import pytest

from oasr.engine import DecodingOptions, Engine, EngineConfig
from oasr.engine.formats import render


@pytest.fixture(scope="module")
def transcript(tiny_en_dir, sample_wav):
    engine = Engine(EngineConfig(model=str(tiny_en_dir)))
    out = engine.transcribe_outputs(sample_wav, sample_rate=16000, decoding=DecodingOptions(timestamps=True))
    assert out.finish_reason == "stop", out.error
    assert len(out.segments) >= 3, "the 30 s sample should give several segments"
    return out


def _expected(out):
    return [(round(s.start, 3), round(s.end, 3), s.text.strip()) for s in out.segments]


def test_srt_parses_back_to_the_segments(transcript):
    import srt

    cues = list(srt.parse(render(transcript, "srt")))
    got = [(round(c.start.total_seconds(), 3), round(c.end.total_seconds(), 3), c.content) for c in cues]
    assert [c.index for c in cues] == list(range(1, len(cues) + 1))
    assert got == _expected(transcript)


def test_vtt_parses_back_to_the_segments(transcript):
    import webvtt

    cues = webvtt.from_buffer(io.StringIO(render(transcript, "vtt")))
    got = [(round(_seconds(c.start), 3), round(_seconds(c.end), 3), c.text) for c in cues]
    assert got == _expected(transcript)


def _seconds(stamp: str) -> float:
    hours, minutes, seconds = stamp.split(":")
    return int(hours) * 3600 + int(minutes) * 60 + float(seconds)
