"""``oasr transcribe`` on a directory of mixed formats: files written, parsed back, progress shown."""

from __future__ import annotations

import io
import json

import av
import numpy as np
import pytest
import soundfile as sf
import srt
import webvtt

from oasr.cli import main
from oasr.engine import Engine, EngineConfig
from tests.engine.conftest import synth


def _write_m4a(path, audio, sr):
    with av.open(str(path), "w", format="mp4") as container:
        stream = container.add_stream("aac", rate=sr)
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray((audio[None, :] * 32767).astype(np.int16), format="s16", layout="mono")
        frame.sample_rate = sr
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)


@pytest.fixture(scope="module")
def audio_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("audio")
    sf.write(d / "a.wav", synth(1.2, 1), 16000)
    sf.write(d / "b.flac", synth(2.0, 2), 22050)
    sf.write(d / "c.ogg", synth(1.5, 3), 16000, format="OGG", subtype="VORBIS")
    sub = d / "nested"
    sub.mkdir()
    _write_m4a(sub / "d.m4a", synth(1.0, 4, sr=44100), 44100)
    (d / "notes.txt").write_text("not audio")
    return d


@pytest.mark.parametrize("fmt", ["srt", "vtt", "json", "verbose_json", "text"])
def test_directory_to_files(tinyctc_dir, audio_dir, tmp_path, capsys, fmt):
    out_dir = tmp_path / "out"
    code = main(["transcribe", str(audio_dir), "--model", str(tinyctc_dir), "-f", fmt, "-o", str(out_dir),
                 "--word-timestamps"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "4/4" in captured.err  # the progress bar reached every file
    ext = {"verbose_json": "json", "text": "txt"}.get(fmt, fmt)
    files = sorted(p.name for p in out_dir.iterdir())
    assert files == [f"{s}.{ext}" for s in ("a", "b", "c", "d")]
    engine = Engine(EngineConfig(model=str(tinyctc_dir)))
    expected = {
        "a": engine.transcribe(str(audio_dir / "a.wav")),
        "d": engine.transcribe(str(audio_dir / "nested" / "d.m4a")),
    }
    for stem, text in expected.items():
        body = (out_dir / f"{stem}.{ext}").read_text()
        if fmt == "srt":
            subs = list(srt.parse(body))
            assert " ".join(s.content for s in subs) == text.strip()
            assert all(s.start <= s.end for s in subs)
        elif fmt == "vtt":
            captions = webvtt.from_buffer(io.StringIO(body))
            assert " ".join(c.text for c in captions) == text.strip()
        elif fmt == "json":
            assert json.loads(body) == {"text": text}
        elif fmt == "verbose_json":
            data = json.loads(body)
            assert data["text"] == text and data["duration"] > 0
            assert data["segments"][0]["text"] == text
            assert all(w["word"] in text for w in data["words"])
        else:
            assert body.strip() == text.strip()


def test_globs_and_errors(tinyctc_dir, audio_dir, tmp_path, capsys):
    bad = tmp_path / "broken.wav"
    bad.write_bytes(b"RIFF....WAVEfmt garbage")
    code = main(["transcribe", str(audio_dir / "*.wav"), str(bad), "--model", str(tinyctc_dir), "--no-progress"])
    captured = capsys.readouterr()
    assert code == 1
    assert "a.wav:" in captured.out
    assert "broken.wav" in captured.err and "1 of 2 file(s) failed" in captured.err
    assert main(["transcribe", str(tmp_path / "missing.wav"), "--model", str(tinyctc_dir)]) == 2
