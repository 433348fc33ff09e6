"""How many concurrent streams one CPU core sustains in real time, and the per-chunk latency.

A WeNet-sized causal U2++ Conformer (12 layers, d=256, random weights) serves N streams with
640 ms chunks (16 encoder frames × 40 ms).  Every 640 ms of (simulated) wall time each stream
receives 640 ms of audio and the engine takes one step, which advances every ready stream in one
batched forward.  The chunk latency is the step's duration (audio of a chunk fully arrived → its
partial result); a stream count is sustained in real time when the p95 latency stays under 640 ms
(RTF = compute time / audio time < 1).  One intra-op thread.

    python benchmarks/streaming.py [--streams 1,4,8,16,32] [--seconds 12] [--left-chunks -1]
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

CHUNK_FRAMES = 16          # encoder frames per chunk
CHUNK_SECONDS = 0.64       # 16 frames x 4 (subsampling) x 10 ms


def run(bundle: Path, streams: int, seconds: float, left_chunks: int) -> dict:
    from oasr.engine import Engine, EngineConfig

    engine = Engine(EngineConfig(model=str(bundle), service_mode="streaming", chunk_size=CHUNK_FRAMES,
                                 num_left_chunks=left_chunks, max_streams=streams,
                                 max_stream_seconds=seconds + 5))
    piece = int(CHUNK_SECONDS * 16000)
    audio = [synth(seconds, seed=i) for i in range(streams)]
    for i in range(streams):
        engine.add_streaming_request(request_id=f"s{i}")
    latencies = []
    compute = 0.0
    pos = 0
    while engine.has_unfinished_requests():
        last = pos + piece >= audio[0].size
        for i in range(streams):
            if pos < audio[i].size:
                engine.feed_chunk(f"s{i}", audio[i][pos:pos + piece], is_last=last)
        pos += piece
        batches = engine.metrics.batches
        t0 = time.perf_counter()
        engine.step()
        dt = time.perf_counter() - t0
        compute += dt
        if engine.metrics.batches > batches:  # this step ran a chunk forward
            latencies.append(dt)
    lat = np.array(latencies[1:] or latencies)  # the first step includes warm-up allocations
    return {"streams": streams, "p50": float(np.percentile(lat, 50)), "p95": float(np.percentile(lat, 95)),
            "rtf": compute / seconds, "pool_mb": engine._streaming.pool_bytes() / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", default="1,4,8,16,32")
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--left-chunks", type=int, default=-1)
    parser.add_argument("--model-dir", default="/tmp/oasr-bench/wenet12")
    args = parser.parse_args()
    torch.set_num_threads(1)
    bundle = wenet_sized_bundle(Path(args.model_dir))
    run(bundle, 1, 2.0, args.left_chunks)  # warm up
    print(f"machine: {machine()}")
    print(f"model: WeNet-sized causal Conformer (12 x 256), chunk {CHUNK_SECONDS * 1000:.0f} ms, "
          f"left chunks {args.left_chunks}, {args.seconds:.0f} s per stream")
    print(f"{'streams':>7} {'p50 ms':>8} {'p95 ms':>8} {'RTF':>6} {'real time':>9} {'pool MB':>8}")
    best = 0
    for n in [int(s) for s in args.streams.split(",")]:
        r = run(bundle, n, args.seconds, args.left_chunks)
        ok = r["p95"] < CHUNK_SECONDS
        best = n if ok else best
        print(f"{n:>7} {r['p50'] * 1000:>8.1f} {r['p95'] * 1000:>8.1f} {r['rtf']:>6.2f} "
              f"{'yes' if ok else 'no':>9} {r['pool_mb']:>8.1f}")
    print(f"streams sustained in real time on one core: {best} (largest tested count with p95 chunk latency "
          f"< {CHUNK_SECONDS * 1000:.0f} ms)")


if __name__ == "__main__":
    main()
