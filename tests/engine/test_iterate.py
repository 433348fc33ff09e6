"""``engine.transcribe_iter``: segments reach the caller while later windows are still decoding.

Each test gates the decode: after a window reports segments, decoding waits (bounded) until the caller
has received the first segment.  An iterator that delivered nothing before decoding ended would leave the
gate closed and the test fails on the recorded order of events, not on a timing threshold.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from oasr.decoding.types import Segment
from oasr.engine import Engine, EngineConfig
from tests.engine.conftest import synth

GATE_SECONDS = 60.0


def gate_windows(engine: Engine, log: list, first_seen: threading.Event) -> None:
    """Wrap the engine's strategy: record each reported window, and hold decoding after the first one
    until the caller has its first segment."""
    decode = engine.strategy.decode

    def gated_decode(batch):
        inner = batch.on_segments

        def on_segments(row, segments, seconds_done, language=None):
            inner(row, segments, seconds_done, language)
            log.append(("window", round(seconds_done, 2)))
            if segments and not first_seen.wait(GATE_SECONDS):
                log.append(("gate timed out", None))

        batch.on_segments = on_segments if inner is not None else None
        return decode(batch)

    engine.strategy.decode = gated_decode


def test_reported_windows_reach_the_caller_before_decoding_ends(tinyctc_dir):
    """The engine plumbing with a strategy that reports two windows (tinyctc's CTC, wrapped)."""
    engine = Engine(EngineConfig(model=str(tinyctc_dir)))
    decode = engine.strategy.decode

    def two_windows(batch):
        batch.on_segments(0, [Segment(0, 0.0, 1.0, "first")], 1.0, "xx")
        batch.on_segments(0, [Segment(1, 1.0, 2.0, "second")], 2.0, "xx")
        return decode(batch)

    engine.strategy.decode = two_windows
    log: list = []
    first_seen = threading.Event()
    gate_windows(engine, log, first_seen)
    segments, info = engine.transcribe_iter(synth(2.0, 1))
    assert info.language == "xx" and info.duration == pytest.approx(2.0)
    got = []
    for segment in segments:
        log.append(("segment", segment.text))
        got.append(segment.text)
        first_seen.set()
    assert got == ["first", "second"]
    assert ("gate timed out", None) not in log
    assert log.index(("segment", "first")) < log.index(("window", 2.0))
    assert info.output is not None and info.output.finish_reason == "stop"


def test_a_strategy_that_reports_no_windows_yields_at_the_end(tinyctc_dir):
    engine = Engine(EngineConfig(model=str(tinyctc_dir)))
    audio = synth(1.5, 2)
    segments, info = engine.transcribe_iter(audio)
    assert [s.text for s in segments] == [engine.transcribe(audio)]
    assert info.seconds_done == info.duration


def _stepping_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "oasr-transcribe-iter"]


def test_the_stepping_thread_is_gone_when_iteration_ends(tinyctc_dir):
    """A script that reads every segment and exits must not leave the stepping thread inside a forward."""
    engine = Engine(EngineConfig(model=str(tinyctc_dir)))
    segments, _ = engine.transcribe_iter(synth(1.5, 3))
    assert list(segments)
    assert _stepping_threads() == []


def test_a_caller_that_stops_early_aborts_the_request_and_the_thread(tinyctc_dir):
    engine = Engine(EngineConfig(model=str(tinyctc_dir)))
    decode = engine.strategy.decode

    def two_windows(batch):
        batch.on_segments(0, [Segment(0, 0.0, 1.0, "first")], 1.0, "xx")
        batch.on_segments(0, [Segment(1, 1.0, 2.0, "second")], 2.0, "xx")
        return decode(batch)

    engine.strategy.decode = two_windows
    segments, info = engine.transcribe_iter(synth(2.0, 4))
    assert next(segments).text == "first"
    segments.close()  # the caller breaks out of its loop
    assert _stepping_threads() == []
    assert not engine.has_unfinished_requests()


@pytest.fixture(scope="module")
def long_speech(tmp_path_factory):
    from tests.models.hf.whisper import _helpers as h

    d = tmp_path_factory.mktemp("iter_speech")
    parts = [h.espeak(text, d / f"{i}.wav") for i, text in enumerate(h.ESPEAK_SENTENCES)]
    pause = np.zeros(12000, np.float32)
    audio = np.concatenate([x for _ in range(3) for p in parts for x in (p, pause)])
    assert len(audio) / 16000 > 65  # three windows or more
    return audio


def test_whisper_long_recording_yields_the_first_segment_before_the_last_window(long_speech):
    engine = Engine(EngineConfig())  # the embedded Whisper tiny.en
    reference = engine.transcribe_outputs(long_speech)
    log: list = []
    first_seen = threading.Event()
    gate_windows(engine, log, first_seen)
    segments, info = engine.transcribe_iter(long_speech)
    assert info.language == "en" and info.duration == pytest.approx(len(long_speech) / 16000, abs=1e-3)
    got = []
    for segment in segments:
        log.append(("segment", segment.start))
        got.append((segment.start, segment.end, segment.text.strip()))
        first_seen.set()
    windows = [i for i, (kind, _) in enumerate(log) if kind == "window"]
    assert len(windows) >= 3
    assert ("gate timed out", None) not in log
    assert log.index(next(e for e in log if e[0] == "segment")) < windows[-1]  # before the last window
    assert got == [(s.start, s.end, s.text.strip()) for s in reference.segments if s.text.strip()]


def test_cli_verbose_prints_each_segment_once_as_its_window_finishes(long_speech, tmp_path, capsys, monkeypatch):
    """--verbose: the segment lines on stderr, in order, each once; the first printed before the last
    decoding round of the Whisper loop (both logged in the order they happen)."""
    import json

    import soundfile as sf

    import oasr.transcribe_cli as cli
    from oasr.cli import main
    from oasr_models_hf.whisper.longform import Transcriber

    path = tmp_path / "long.wav"
    sf.write(path, long_speech, 16000, subtype="FLOAT")
    log: list = []
    print_segments, round_ = cli._print_segments, Transcriber._round

    def logged_print(source, segments, many):
        log.append(("print", len(segments)))
        return print_segments(source, segments, many)

    def logged_round(self, batch):
        log.append(("round", len(batch)))
        return round_(self, batch)

    monkeypatch.setattr(cli, "_print_segments", logged_print)
    monkeypatch.setattr(Transcriber, "_round", logged_round)
    out = tmp_path / "out.json"
    assert main(["transcribe", str(path), "--verbose", "-f", "verbose_json", "-o", str(out)]) == 0
    segments = [s for s in json.loads(out.read_text())["segments"] if s["text"].strip()]
    assert len(segments) >= 6
    rounds = [i for i, (kind, _) in enumerate(log) if kind == "round"]
    first_print = next(i for i, (kind, n) in enumerate(log) if kind == "print" and n)
    assert len(rounds) >= 3 and first_print < rounds[-1]
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[")]
    assert [line.split("] ", 1)[1] for line in lines] == [s["text"].strip() for s in segments]
