"""Offline engine throughput by batch size, and where the time goes.

A WeNet-sized U2++ Conformer (12 layers, d=256, vocab 5000, random weights, native bundle built on
first run) transcribes the same set of varied-length clips at several ``max_batch_size`` settings,
one intra-op thread.  Prints seconds of audio per second, the real-time factor, and the share of
time spent in features / encoder / decode for each setting.

    python benchmarks/engine.py [--clips 48] [--batch-sizes 1,4,8,16,32] [--policy bucket]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, synth, wenet_sized_bundle  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clips", type=int, default=48)
    parser.add_argument("--batch-sizes", default="1,4,8,16,32")
    parser.add_argument("--policy", default="bucket")
    parser.add_argument("--model-dir", default="/tmp/oasr-bench/wenet12")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from oasr.engine import Engine, EngineConfig

    bundle = wenet_sized_bundle(Path(args.model_dir))
    rng = np.random.default_rng(0)
    clips = [synth(float(rng.uniform(1.0, 15.0)), seed=i) for i in range(args.clips)]
    audio_seconds = sum(c.size for c in clips) / 16000
    print(f"machine: {machine()}")
    print(f"model: WeNet-sized Conformer (12 x 256, vocab 5000), {args.clips} clips, {audio_seconds:.0f} s of audio")
    print(f"{'batch':>5} {'audio s/s':>10} {'RTF':>8} {'features':>9} {'encoder':>8} {'decode':>7}")
    for batch in [int(b) for b in args.batch_sizes.split(",")]:
        engine = Engine(EngineConfig(model=str(bundle), max_batch_size=batch, schedule_policy=args.policy))
        engine.transcribe_outputs(clips[:2], sample_rate=16000)  # warm up
        engine.metrics.stage_seconds.clear()
        t0 = time.perf_counter()
        outs = engine.transcribe_outputs(clips, sample_rate=16000)
        wall = time.perf_counter() - t0
        assert all(o.finish_reason == "stop" for o in outs)
        share = engine.metrics_snapshot()["stage_share"]
        print(f"{batch:>5} {audio_seconds / wall:>10.1f} {wall / audio_seconds:>8.4f} "
              f"{share.get('features', 0):>9.1%} {share.get('encoder', 0):>8.1%} {share.get('decode', 0):>7.1%}")


if __name__ == "__main__":
    main()
