"""Ray Data batch transcription: throughput with 1 and 2 workers (one torch thread each) and the
scaling efficiency, on a WeNet-sized U2++ Conformer (random weights, CPU-bound).

    python benchmarks/ray.py [--files 80] [--seconds 20]

The peer is the same job with one worker on the same local Ray cluster, measured in the same run;
the in-process engine (one thread, no Ray) is printed beside it to show Ray's own overhead.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=80)
    parser.add_argument("--seconds", type=float, default=20.0)
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

        engine = Engine(EngineConfig(model=str(bundle), num_threads=1))
        start = time.perf_counter()
        engine.transcribe_outputs([str(p) for p in sorted(corpus.glob("*.wav"))])
        in_process = time.perf_counter() - start

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
        rates = {}
        for workers in (1, 2):
            out = root / f"out{workers}"
            start = time.perf_counter()
            summary = transcribe_dataset([corpus], out, model=str(bundle), workers=workers, batch_size=8,
                                         progress=False)
            elapsed = time.perf_counter() - start
            assert summary.ok and len(summary.transcribed) == args.files
            rates[workers] = audio_seconds / elapsed
        ray.shutdown()
    finally:
        shutil.rmtree(root, ignore_errors=True)

    print(f"machine: {machine()}")
    print(f"{args.files} files, {audio_seconds:.0f} s of audio, WeNet-sized U2++ Conformer (12 x 256), one thread each")
    print(f"in-process engine (no Ray):  {audio_seconds / in_process:8.1f} audio s / s")
    print(f"Ray Data, 1 worker:          {rates[1]:8.1f} audio s / s")
    print(f"Ray Data, 2 workers:         {rates[2]:8.1f} audio s / s")
    print(f"scaling 2 vs 1 worker: {rates[2] / rates[1]:.2f}x (efficiency {rates[2] / rates[1] / 2:.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
