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

Hostile-client scenarios (``--scenario``), each against one server at the first batch size:

``slow-clients``
    the good clients' throughput and latency alone, then again while ``--slow-clients`` uploads
    trickle their bodies one byte every 3 s (they hold upload slots, never concurrency slots); the
    ratio of good throughput with and without them.
``abandoned``
    the idle latency of one ``--short-seconds`` request (median of 5), then a ``--long-seconds``
    silent FLAC upload whose client goes away ``--abandon-after`` seconds after it was admitted (its
    decode running), then the short request
    again: its latency over the idle latency (compute follows clients: the abandoned forward leaves
    at its next module).
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
    p.add_argument("--scenario", choices=("load", "slow-clients", "abandoned"), default="load")
    p.add_argument("--slow-clients", type=int, default=64, help="slow-clients: trickling uploads")
    p.add_argument("--short-seconds", type=float, default=4.0, help="abandoned: the good request's audio")
    p.add_argument("--long-seconds", type=float, default=1200.0, help="abandoned: the abandoned upload's audio")
    p.add_argument("--abandon-after", type=float, default=3.0,
                   help="abandoned: seconds after the long request is admitted that its client goes away")
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


async def trickle(port: int, audio: bytes, count: int, stop_at: float) -> int:
    """``count`` uploads that send their head and a byte of body every 3 s until ``stop_at``; how many the
    server answered (its body deadline) before then."""
    request = httpx.Request("POST", f"http://127.0.0.1:{port}/v1/audio/transcriptions",
                            files={"file": ("clip.wav", audio, "audio/wav")}, data={"model": "bench"})
    body = request.read()
    head = ("POST /v1/audio/transcriptions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            + "".join(f"{k}: {v}\r\n" for k, v in request.headers.items() if k.lower() != "host") + "\r\n").encode()
    answered = 0

    async def one() -> None:
        nonlocal answered
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(head + body[:1])
            for i in range(1, len(body)):
                if time.monotonic() >= stop_at:
                    return
                try:
                    if await asyncio.wait_for(reader.read(1), 3.0):
                        answered += 1
                        return
                except TimeoutError:
                    pass
                writer.write(body[i:i + 1])
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    await asyncio.gather(*(one() for _ in range(count)), return_exceptions=True)
    return answered


def slow_clients(args: argparse.Namespace, port: int, audio: bytes, clip_seconds: float) -> None:
    alone = asyncio.run(load(port, audio, clients=args.clients, warmup=args.warmup, duration=args.duration,
                             timeout=args.request_timeout))

    async def with_tricklers() -> tuple[dict, int]:
        stop_at = time.monotonic() + args.warmup + args.duration
        slow = asyncio.ensure_future(trickle(port, audio, args.slow_clients, stop_at))
        result = await load(port, audio, clients=args.clients, warmup=args.warmup, duration=args.duration,
                            timeout=args.request_timeout)
        return result, await slow

    loaded, answered = asyncio.run(with_tricklers())
    rates = []
    for name, result in (("alone", alone), (f"+{args.slow_clients} slow", loaded)):
        lat = np.array(result["latencies"])
        rates.append(len(lat) / args.duration)
        p50, p95 = np.percentile(lat, [50, 95]) if len(lat) else (float("nan"),) * 2
        errors = ", ".join(f"{k}: {v}" for k, v in result["errors"].items()) or "0"
        print(f"{name:>12}: {rates[-1]:.2f} good req/s, p50 {p50:.3f} s, p95 {p95:.3f} s, errors {errors}", flush=True)
    print(f"slow uploads answered 408 by the body deadline within the run: {answered}")
    print(f"good throughput with / without slow uploads: {rates[1] / rates[0]:.2f}x" if rates[0] else "no baseline")


def abandoned(args: argparse.Namespace, port: int, audio: bytes) -> None:
    import io

    samples, rate = sf.read(io.BytesIO(audio), dtype="int16")
    short = io.BytesIO()
    sf.write(short, samples[: int(args.short_seconds * rate)], rate, format="WAV")
    short_bytes = short.getvalue()
    long = io.BytesIO()
    sf.write(long, np.zeros(int(args.long_seconds * 16000), np.int16), 16000, format="FLAC")
    url = f"http://127.0.0.1:{port}/v1/audio/transcriptions"

    def timed() -> float:
        t0 = time.monotonic()
        response = httpx.post(url, files={"file": ("short.wav", short_bytes)}, data={"model": "bench"},
                              timeout=args.request_timeout)
        response.raise_for_status()
        return time.monotonic() - t0

    timed()  # warm-up
    idle = float(np.median([timed() for _ in range(5)]))

    async def abandon() -> None:
        async with httpx.AsyncClient(timeout=args.request_timeout) as http:
            task = asyncio.ensure_future(http.post(url, files={"file": ("long.flac", long.getvalue())},
                                                   data={"model": "bench"}))
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and "oasr_in_flight_requests 1.0" not in scrape(port):
                await asyncio.sleep(0.05)
            await asyncio.sleep(args.abandon_after)  # admission (decode, resample) done, the forward running
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(abandon())
    after = timed()
    print(f"idle latency of a {args.short_seconds:g} s request: {idle:.3f} s; right after abandoning a "
          f"{args.long_seconds:g} s upload mid-decode: {after:.3f} s ({after / idle:.2f}x idle)")
    t0 = time.monotonic()
    status = httpx.post(url, files={"file": ("long.flac", long.getvalue())}, data={"model": "bench"},
                        timeout=args.request_timeout).status_code
    print(f"the same {args.long_seconds:g} s upload decoded to the end (what an abandoned one cost before "
          f"cancellation): {time.monotonic() - t0:.1f} s (HTTP {status})")


def scrape(port: int) -> str:
    return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text


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
    if args.scenario != "load":
        port = free_port()
        proc = launch(args, model, int(args.batch_sizes.split(",")[0]), port)
        try:
            wait_ready(proc, port, args.startup_timeout)
            if args.scenario == "slow-clients":
                slow_clients(args, port, audio, clip_seconds)
            else:
                abandoned(args, port, audio)
        finally:
            stop(proc)
            if tmp is not None:
                tmp.cleanup()
        return 0
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
