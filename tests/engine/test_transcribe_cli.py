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
    # the progress bar counts audio seconds (1.2 + 32000/22050 + 1.5 + 1.0) and reaches the end
    assert "5.2/5.2 audio s" in captured.err
    ext = {"verbose_json": "json", "text": "txt"}.get(fmt, fmt)
    files = sorted(str(p.relative_to(out_dir)) for p in out_dir.rglob("*") if p.is_file())
    assert files == [f"{s}.{ext}" for s in ("a", "b", "c", "nested/d")]  # the input tree, mirrored
    engine = Engine(EngineConfig(model=str(tinyctc_dir)))
    expected = {
        "a": engine.transcribe(str(audio_dir / "a.wav")),
        "nested/d": engine.transcribe(str(audio_dir / "nested" / "d.m4a")),
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


@pytest.fixture()
def clashing_dir(tmp_path):
    """Three inputs that would all write ``sample.srt`` in a flattened tree, and one in a sub-folder."""
    d = tmp_path / "media"
    (d / "sub").mkdir(parents=True)
    sf.write(d / "sample.wav", synth(1.0, 5), 16000)
    sf.write(d / "sample.flac", synth(1.3, 6), 16000)
    _write_m4a(d / "sample.m4a", synth(0.8, 7, sr=44100), 44100)
    sf.write(d / "sub" / "sample.wav", synth(1.1, 8), 16000)
    return d


def test_directory_output_never_loses_a_file(tinyctc_dir, clashing_dir, tmp_path, capsys):
    out = tmp_path / "subs"
    args = ["transcribe", str(clashing_dir), "--model", str(tinyctc_dir), "-f", "srt", "-o", str(out), "--no-progress"]
    assert main(args) == 0
    written = sorted(str(p.relative_to(out)) for p in out.rglob("*.srt"))
    assert written == ["sample.flac.srt", "sample.m4a.srt", "sample.wav.srt", "sub/sample.srt"]
    engine = Engine(EngineConfig(model=str(tinyctc_dir)))
    for name in ("sample.flac", "sample.m4a", "sample.wav"):
        subs = list(srt.parse((out / f"{name}.srt").read_text()))
        assert " ".join(s.content for s in subs) == engine.transcribe(str(clashing_dir / name)).strip()
    # a second run refuses to replace them unless asked
    before = (out / "sub" / "sample.srt").stat().st_mtime_ns
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("oasr: error: 4 output file(s) already exist") and "--overwrite" in err
    assert (out / "sub" / "sample.srt").stat().st_mtime_ns == before
    assert main([*args, "--overwrite"]) == 0


@pytest.mark.parametrize("fmt", ["srt", "verbose_json", "tsv"])
def test_many_files_on_stdout_are_labelled(tinyctc_dir, clashing_dir, capsys, fmt):
    assert main(["transcribe", str(clashing_dir), "--model", str(tinyctc_dir), "-f", fmt, "--no-progress"]) == 0
    out = capsys.readouterr().out
    names = [str(clashing_dir / n) for n in ("sample.flac", "sample.m4a", "sample.wav", "sub/sample.wav")]
    if fmt == "verbose_json":
        rows = [json.loads(line) for line in out.splitlines()]
        assert [r["file"] for r in rows] == names and all("segments" in r for r in rows)
    else:
        assert [line[4:-4] for line in out.splitlines() if line.startswith("==> ")] == names


def test_ctrl_c_keeps_finished_files_and_exits_with_one_line(tinyctc_dir, clashing_dir, tmp_path, capsys,
                                                             monkeypatch):
    """The interrupt arrives while the second batch decodes: the first batch's files are on disk."""
    out = tmp_path / "out"
    calls = {"n": 0}
    original = Engine.step

    def step(self, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return original(self, **kwargs)

    monkeypatch.setattr(Engine, "step", step)
    code = main(["transcribe", str(clashing_dir), "--model", str(tinyctc_dir), "-o", str(out), "--batch-size", "2",
                 "--no-progress"])
    err = capsys.readouterr().err
    assert code == 130
    assert err.strip().splitlines() == ["oasr: interrupted: 2 of 4 file(s) finished and written"]
    assert len(list(out.rglob("*.txt"))) == 2


@pytest.mark.parametrize(("flags", "message"), [
    (["--beam-size", "0"], "argument --beam-size: must be an integer >= 1, got 0"),
    (["--best-of", "-2"], "argument --best-of: must be an integer >= 1"),
    (["--patience", "0"], "argument --patience: must be a finite number > 0"),
    (["--temperature", "-1"], "argument --temperature: must be a finite number >= 0"),
    (["--suppress-tokens=a,b"], "expected comma-separated token ids"),
    (["--condition_on_previous_text", "maybe"], "expected True or False"),
    (["--max-line-width", "0"], "argument --max-line-width: must be an integer >= 1"),
])
def test_invalid_values_are_refused_by_the_parser(tinyctc_dir, audio_dir, capsys, flags, message):
    with pytest.raises(SystemExit) as exc:
        main(["transcribe", str(audio_dir / "a.wav"), "--model", str(tinyctc_dir), *flags])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(("flags", "message"), [
    (["--initial-prompt", "hello"], "--initial-prompt is not served by decode method 'ctc'"),
    (["--device", "cuda"], "--device cuda: CUDA is not available"),
    (["--device", "tpu9"], "--device 'tpu9' is not a device"),
    (["--decode-option", "nonsense"], "--decode-option expects KEY=VALUE"),
    (["-f", "all"], "-f all writes one file per format: give an output directory with -o"),
])
def test_options_the_model_or_machine_cannot_serve_are_one_line(tinyctc_dir, audio_dir, capsys, flags, message):
    import torch

    if flags[:2] == ["--device", "cuda"] and torch.cuda.is_available():
        flags = ["--device", f"cuda:{torch.cuda.device_count()}"]
        message = "CUDA device(s) are visible"
    assert main(["transcribe", str(audio_dir / "a.wav"), "--model", str(tinyctc_dir), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("oasr: error: ") and message in err and len(err.strip().splitlines()) == 1


def test_device_auto_picks_cuda_when_present(monkeypatch):
    import torch

    from oasr.cli import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == "cuda"


def test_all_formats_into_a_directory(tinyctc_dir, audio_dir, tmp_path):
    out = tmp_path / "all"
    assert main(["transcribe", str(audio_dir / "a.wav"), "--model", str(tinyctc_dir), "-f", "all", "-o", str(out),
                 "--no-progress"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["a.json", "a.srt", "a.tsv", "a.txt", "a.vtt"]
    assert json.loads((out / "a.json").read_text())["segments"]
    assert (out / "a.tsv").read_text().startswith("start\tend\ttext\n")


def test_no_default_model_is_explained_in_cli_words(audio_dir, capsys, monkeypatch):
    from oasr import plugins

    real = plugins.registry

    class NoAliases:
        def __iter__(self):
            return iter(())

    monkeypatch.setattr(plugins, "registry", lambda kind: NoAliases() if kind == "aliases" else real(kind))
    assert main(["transcribe", str(audio_dir / "a.wav")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("oasr: error: no --model given") and "EngineConfig" not in err
    assert 'pip install "oasr-core[hf]"' in err
