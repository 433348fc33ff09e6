"""Ray Data batch transcription: identical to in-process transcription, resumable, and robust to a
worker killed mid-job."""

from __future__ import annotations

import threading
import time

import pytest
import soundfile as sf

from oasr.engine import Engine, EngineConfig
from oasr.engine.formats import render


@pytest.fixture(scope="module")
def in_process(corpus, wenet_model):
    """Each corpus file transcribed in this process, keyed by its path relative to the corpus."""
    engine = Engine(EngineConfig(model=str(wenet_model)))
    files = sorted(corpus.rglob("*.wav"))
    outputs = engine.transcribe_outputs([str(f) for f in files])
    texts = {f.relative_to(corpus).with_suffix(".json"): render(o, "json") for f, o in zip(files, outputs, strict=True)}
    assert len({t for t in texts.values()}) >= 30, "the corpus should give varied transcripts"
    return texts


def _written(out_dir):
    return {p.relative_to(out_dir): p.read_text(encoding="utf-8") for p in out_dir.rglob("*") if p.is_file()}


def test_a_data_job_equals_in_process_transcription_and_resumes(ray_cluster, corpus, wenet_model, in_process,
                                                                tmp_path):
    from oasr.ray import transcribe_dataset

    out = tmp_path / "out"
    summary = transcribe_dataset([corpus], out, model=str(wenet_model), formats=["json"], workers=2, batch_size=4,
                                 progress=False)
    assert summary.ok and len(summary.transcribed) == 42 and summary.skipped == []
    assert _written(out) == in_process
    # each file's timing: its batch ran on one of the two workers after that worker's engine was built,
    # and the audio duration reported is the file's
    assert sorted(summary.timings) == sorted(summary.transcribed)
    for path, timing in summary.timings.items():
        assert timing.loading <= timing.ready <= timing.started <= timing.finished
        assert timing.seconds == pytest.approx(sf.info(path).duration, abs=1 / 16000)
    assert 1 <= len({t.worker for t in summary.timings.values()}) <= 2
    # a rerun finds every file finished and redoes nothing
    (out / "a" / "clip00.json").unlink()
    again = transcribe_dataset([corpus], out, model=str(wenet_model), formats=["json"], workers=1, progress=False)
    assert len(again.skipped) == 41 and [p.rsplit("/", 1)[-1] for p in again.transcribed] == ["clip00.wav"]
    assert list(again.timings) == again.transcribed
    assert _written(out) == in_process


def test_a_manifest_input(ray_cluster, corpus, wenet_model, in_process, tmp_path):
    from oasr.ray import transcribe_dataset

    manifest = corpus / "list.txt"
    manifest.write_text("".join(f"{p.relative_to(corpus)}\n" for p in sorted(corpus.rglob("*.wav"))[:6]))
    out = tmp_path / "out"
    summary = transcribe_dataset([manifest], out, model=str(wenet_model), formats=["json"], workers=1,
                                 progress=False)
    assert summary.ok and len(summary.transcribed) == 6
    written = _written(out)
    assert len(written) == 6 and all(in_process[rel] == text for rel, text in written.items())


def test_a_worker_killed_mid_job_loses_and_duplicates_nothing(ray_cluster, corpus, wenet_model, in_process, tmp_path):
    import psutil

    from oasr.ray import transcribe_dataset

    out = tmp_path / "out"
    killed: list[int] = []

    def kill_one_worker():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            if any(out.rglob("*.json")):
                for proc in psutil.process_iter(["pid", "cmdline"]):
                    cmdline = " ".join(proc.info["cmdline"] or [])
                    if cmdline.startswith("ray::MapWorker"):
                        proc.kill()
                        killed.append(proc.info["pid"])
                        return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_one_worker, daemon=True)
    killer.start()
    summary = transcribe_dataset([corpus], out, model=str(wenet_model), formats=["json"], workers=2, batch_size=2,
                                 progress=False)
    killer.join(5)
    assert killed, "no worker was running to be killed"
    assert summary.ok and sorted(summary.transcribed) == sorted(str(p) for p in corpus.rglob("*.wav"))
    assert sorted(summary.timings) == sorted(summary.transcribed)  # a retried batch reports its last try
    written = _written(out)
    assert written == in_process  # every file once, none partial (no temporary file left behind)


def test_oasr_transcribe_ray_equals_oasr_transcribe_file_for_file(ray_cluster, corpus, wenet_model, tmp_path):
    from oasr.cli import main

    common = [str(corpus), "--model", str(wenet_model), "-f", "srt", "--no-progress"]
    assert main(["transcribe", *common, "-o", str(tmp_path / "local")]) == 0
    assert main(["transcribe", *common, "-o", str(tmp_path / "ray"), "--ray", "--workers", "2"]) == 0
    local, ray = _written(tmp_path / "local"), _written(tmp_path / "ray")
    assert len(local) == 42 and ray == local
    assert main(["transcribe", *common, "--ray"]) == 2  # --ray needs an output directory
