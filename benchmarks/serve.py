"""Load test of ``oasr serve``: concurrent OpenAI-style clients against a real server on 127.0.0.1.

For each ``--max-batch-size`` given (default 16 then 1), the script starts ``oasr serve`` in a
subprocess on a free loopback port, runs ``--clients`` concurrent clients that each post
``/v1/audio/transcriptions`` back to back, and reports, over the requests completed in the
``--duration`` seconds after ``--warmup`` (make the warm-up longer than a request's latency),
requests/s, audio-seconds/s, latency percentiles and errors.  The last line
is the cross-request batching gain: throughput at the first batch size over throughput at the last.

Bounded: the clients are cancelled at the deadline, every request has a timeout, the server is
stopped (SIGTERM, then SIGKILL after a grace period) whatever happens.  Traffic goes to 127.0.0.1 only.

    python benchmarks/serve.py                                   # whisper-tiny.en, 32 clients, 60 s
    python benchmarks/serve.py --model ../shared/fixtures/wenet_u2pp/model --duration 20
    python benchmarks/serve.py --tinyctc --clients 8 --duration 5  # the test plugin: server overhead
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import soundfile as sf

REPO = Path(__file__).resolve().parents[1]
TINYCTC_SRC = REPO / "tests" / "plugins" / "oasr-tinyctc" / "src"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="whisper-tiny.en", help="what `oasr serve --model` gets")
    p.add_argument("--tinyctc", action="store_true", help="serve a random checkpoint of the tests' tinyctc plugin")
    p.add_argument("--audio", type=Path, default=REPO / "samples" / "sample.wav", help="the clip every request sends")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--duration", type=float, default=60.0, help="measured seconds per batch size")
    p.add_argument("--warmup", type=float, default=5.0, help="seconds of load before measuring")
    p.add_argument("--batch-sizes", default="16,1", help="comma-separated --max-batch-size values to compare")
    p.add_argument("--max-wait-time", type=float, default=0.005, help="the server's --max-wait-time")
    p.add_argument("--threads", type=int, default=1, help="the server's torch threads")
    p.add_argument("--startup-timeout", type=float, default=300.0)
    p.add_argument("--request-timeout", type=float, default=300.0)
    return p.parse_args(argv)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(args: argparse.Namespace, model: str, batch_size: int, port: int) -> subprocess.Popen:
    argv = ["serve", "--model", model, "--port", str(port), "--host", "127.0.0.1", "--served-model-name", "bench",
            "--max-batch-size", str(batch_size), "--max-wait-time", str(args.max_wait_time),
            "--max-concurrency", str(2 * args.clients), "--threads", str(args.threads),
            "--request-timeout", str(args.request_timeout), "--no-access-log", "--log-level", "warning"]
    register = ""
    if args.tinyctc:
        register = (f"sys.path.insert(0, {str(TINYCTC_SRC)!r})\n"
                    "from oasr.models import register_model\n"
                    "register_model('tinyctc', 'oasr_tinyctc.model:TinyCtcModel', 'oasr_tinyctc.model:TinyCtcConfig',"
                    " 'oasr_tinyctc.convert:TinyCtcConverter')\n")
    code = f"import sys\n{register}from oasr.cli import main\nsys.exit(main({argv!r}))\n"
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def wait_ready(proc: subprocess.Popen, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"oasr serve exited with {proc.returncode}: {proc.stderr.read()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"oasr serve was not ready within {timeout:g} s")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


async def load(port: int, audio: bytes, *, clients: int, warmup: float, duration: float,
               timeout: float) -> dict:
    """Run the clients; latencies and errors of the requests that complete inside the measured window.

    At the deadline the clients are cancelled: their open requests are disconnected (the server
    aborts them), so the run never outlasts ``warmup + duration``.
    """
    start = time.monotonic()
    measure_from, deadline = start + warmup, start + warmup + duration
    latencies: list[float] = []
    errors: dict[str, int] = {}
    url = f"http://127.0.0.1:{port}/v1/audio/transcriptions"

    async def client(http: httpx.AsyncClient) -> None:
        while time.monotonic() < deadline:
            t0 = time.monotonic()
            try:
                response = await http.post(url, files={"file": ("clip.wav", audio, "audio/wav")},
                                           data={"model": "bench"})
                outcome = "ok" if response.status_code == 200 else f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                outcome = type(exc).__name__
            t1 = time.monotonic()
            if measure_from <= t1 <= deadline:
                if outcome == "ok":
                    latencies.append(t1 - t0)
                else:
                    errors[outcome] = errors.get(outcome, 0) + 1

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as http:
        tasks = [asyncio.create_task(client(http)) for _ in range(clients)]
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {"latencies": latencies, "errors": errors}


def scrape_batch_size(port: int) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    count = values.get("oasr_batch_size_count")
    return values["oasr_batch_size_sum"] / count if count else None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    samples, rate = sf.read(args.audio, dtype="float32")
    audio = args.audio.read_bytes()
    clip_seconds = len(samples) / rate
    model = args.model
    tmp = None
    if args.tinyctc:
        sys.path.insert(0, str(TINYCTC_SRC))
        from oasr_tinyctc.convert import write_checkpoint

        tmp = tempfile.TemporaryDirectory()
        model = str(write_checkpoint(Path(tmp.name) / "tinyctc"))
    import torch

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.processor() or platform.platform()}; "
          f"python {platform.python_version()}, torch {torch.__version__}")
    print(f"model: {'tinyctc (random)' if args.tinyctc else args.model}; clip {args.audio.name} {clip_seconds:.2f} s; "
          f"{args.clients} clients, {args.duration:g} s measured after {args.warmup:g} s warm-up; server threads "
          f"{args.threads}, max-wait-time {args.max_wait_time:g} s")
    print(f"{'batch':>5} {'req/s':>8} {'audio s/s':>10} {'p50 s':>8} {'p95 s':>8} {'p99 s':>8} {'mean batch':>10} "
          f"{'requests':>8}  errors")
    throughput = {}
    for batch_size in [int(b) for b in args.batch_sizes.split(",")]:
        port = free_port()
        proc = launch(args, model, batch_size, port)
        try:
            wait_ready(proc, port, args.startup_timeout)
            result = asyncio.run(load(port, audio, clients=args.clients, warmup=args.warmup,
                                      duration=args.duration, timeout=args.request_timeout))
            mean_batch = scrape_batch_size(port)
        finally:
            stop(proc)
        lat = np.array(result["latencies"])
        rps = len(lat) / args.duration
        throughput[batch_size] = rps
        p50, p95, p99 = np.percentile(lat, [50, 95, 99]) if len(lat) else (float("nan"),) * 3
        errors = ", ".join(f"{k}: {v}" for k, v in result["errors"].items()) or "0"
        print(f"{batch_size:>5} {rps:>8.2f} {rps * clip_seconds:>10.1f} {p50:>8.3f} {p95:>8.3f} {p99:>8.3f} "
              f"{mean_batch or 0:>10.2f} {len(lat):>8}  {errors}", flush=True)
    sizes = list(throughput)
    if len(sizes) >= 2 and throughput[sizes[-1]]:
        print(f"cross-request batching gain (batch {sizes[0]} vs {sizes[-1]}): "
              f"{throughput[sizes[0]] / throughput[sizes[-1]]:.2f}x")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
