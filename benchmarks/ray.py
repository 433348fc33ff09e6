"""Ray Data batch transcription: throughput with 1 and 2 workers (one torch thread each) and the
scaling 2 vs 1 worker, end to end and in steady state, on a WeNet-sized U2++ Conformer (random
weights, CPU-bound).

    OMP_NUM_THREADS=1 python benchmarks/ray.py [--files 80] [--seconds 20] [--repeats 2]

With the defaults (80 files, 1400 s of audio, each worker count run twice, alternating) it takes about
4-5 minutes on an idle 2-core box; ``--repeats 1`` about 3 (6.5 on the shared box at load average 12).

The peer is the same job with one worker on the same local Ray cluster, measured in the same run; the
in-process engine (one thread, no Ray) is printed beside it to show Ray's own overhead.  Ray is started,
and a two-file job run, before any clock runs.  Two rates per job:

- end to end: the corpus's audio seconds over the job's wall time — the workers' start-up (process
  start, imports, model load) and the end of the job (one worker finishing while the other idles) included;
- steady state: from the per-batch timestamps the workers report (``DatasetSummary.timings``), the audio
  transcribed while every worker is running — from the latest worker's first batch start to the earliest
  worker's last batch end, a batch straddling an end counted pro rata — over that window.  It is the
  workers' throughput, what "2 workers give >= 1.6x one worker" asks for; the gaps between batches (Ray
  handing blocks over, audio decoding in Ray tasks) are inside it.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import soundfile as sf

# This file is named ray.py: keep its folder off sys.path so ``import ray`` finds Ray, and load the
# shared helpers by path.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
_spec = importlib.util.spec_from_file_location("_common", HERE / "_common.py")
_common = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_common)
machine, synth, wenet_sized_bundle = _common.machine, _common.synth, _common.wenet_sized_bundle


def steady_state(timings) -> tuple[float, float]:
    """(audio s / s, window s) while every worker is running; see the module docstring."""
    batches: dict[tuple[str, float, float], float] = {}
    for t in timings.values():
        key = (t.worker, t.started, t.finished)
        batches[key] = batches.get(key, 0.0) + t.seconds
    workers = {w for w, _, _ in batches}
    begin = max(min(s for w2, s, _ in batches if w2 == w) for w in workers)
    end = min(max(f for w2, _, f in batches if w2 == w) for w in workers)
    if end <= begin:
        return float("nan"), 0.0
    audio = sum(sec * max(0.0, min(f, end) - max(s, begin)) / max(f - s, 1e-9)
                for (_, s, f), sec in batches.items())
    return audio / (end - begin), end - begin


def profile(timings, start: float, stop: float) -> str:
    """Where the job's wall time went outside the steady state, in seconds from the job's start."""
    workers = {t.worker: t for t in timings.values()}.values()
    first_batch = min(t.started for t in timings.values())
    last_batch = max(t.finished for t in timings.values())
    loading = ", ".join(f"{t.loading - start:.1f}" for t in workers)
    loads = ", ".join(f"{t.ready - t.loading:.1f}" for t in workers)
    gaps = []
    for worker in workers:
        spans = sorted({(t.started, t.finished) for t in timings.values() if t.worker == worker.worker})
        gaps += [b[0] - a[1] for a, b in zip(spans, spans[1:], strict=False)]
    gap = f"{1000 * statistics.mean(gaps):.0f} ms" if gaps else "-"
    return (f"engine builds began at {loading} s and took {loads} s, first batch at {first_batch - start:.1f} s, "
            f"mean gap between a worker's batches {gap}, last batch done {stop - last_batch:.1f} s before the end")


def run_jobs(corpus: Path, bundle: Path, root: Path, audio_seconds: float, repeats: int) -> dict[int, list]:
    from oasr.ray import transcribe_dataset

    results: dict[int, list] = {1: [], 2: []}
    for run in range(repeats):
        for workers in ((1, 2) if run % 2 == 0 else (2, 1)):
            out = root / f"out{workers}-{run}"
            start = time.time()
            summary = transcribe_dataset([corpus], out, model=str(bundle), workers=workers, batch_size=8,
                                         progress=False)
            stop = time.time()
            assert summary.ok and len(summary.transcribed) == len(summary.timings), summary.failed
            steady, window = steady_state(summary.timings)
            results[workers].append((audio_seconds / (stop - start), steady))
            print(f"  run {run + 1}, {workers} worker(s): end to end {audio_seconds / (stop - start):6.1f}, "
                  f"steady state {steady:6.1f} audio s / s over {window:.1f} of {stop - start:.1f} s; "
                  f"{profile(summary.timings, start, stop)}", flush=True)
            busy = len({t.worker for t in summary.timings.values()})
            if busy < workers:
                print(f"  (only {busy} of {workers} workers got a batch: too few files for the steady state)")
            shutil.rmtree(out, ignore_errors=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=80)
    parser.add_argument("--seconds", type=float, default=20.0, help="file durations are 0.5, 0.75, 1 and 1.25 x this")
    parser.add_argument("--repeats", type=int, default=2, help="jobs per worker count (alternating order)")
    args = parser.parse_args()

    import ray
    import torch

    from oasr.engine import Engine, EngineConfig
    from oasr.ray import transcribe_dataset

    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="oasr-ray-bench-"))
    try:
        bundle = wenet_sized_bundle(root / "model")
        corpus = root / "corpus"
        corpus.mkdir()
        for i in range(args.files):
            sf.write(corpus / f"f{i:03d}.wav", synth(args.seconds * (0.5 + (i % 4) / 4), seed=i), 16000)
        audio_seconds = sum(sf.info(p).duration for p in corpus.glob("*.wav"))
        print(f"machine: {machine()}")
        print(f"{args.files} files, {audio_seconds:.0f} s of audio, WeNet-sized U2++ Conformer (12 x 256), "
              "one thread each", flush=True)

        engine = Engine(EngineConfig(model=str(bundle), num_threads=1))
        start = time.perf_counter()
        engine.transcribe_outputs([str(p) for p in sorted(corpus.glob("*.wav"))])
        in_process = audio_seconds / (time.perf_counter() - start)
        del engine
        print(f"in-process engine (no Ray): {in_process:6.1f} audio s / s", flush=True)

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
        try:
            # a session's first Ray Data job also starts Ray Data's own actors (stats, autoscaling coordinator,
            # locality tracker: a process each); a two-file job pays for them before any clock runs
            warm = root / "warm"
            warm.mkdir()
            for name in sorted(p.name for p in corpus.glob("*.wav"))[-2:]:
                shutil.copy(corpus / name, warm / name)
            transcribe_dataset([warm], root / "warm-out", model=str(bundle), workers=1, progress=False)
            results = run_jobs(corpus, bundle, root, audio_seconds, args.repeats)
        finally:
            ray.shutdown()
    finally:
        shutil.rmtree(root, ignore_errors=True)

    for name, column in (("end to end", 0), ("steady state", 1)):
        one = statistics.median(r[column] for r in results[1])
        two = statistics.median(r[column] for r in results[2])
        per_run = ", ".join(f"{b[column] / a[column]:.2f}x" for a, b in zip(results[1], results[2], strict=True))
        print(f"{name:>12}: 1 worker {one:6.1f}, 2 workers {two:6.1f} audio s / s (medians); "
              f"scaling 2 vs 1 worker {two / one:.2f}x (efficiency {two / one / 2:.0%}); per run {per_run}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
