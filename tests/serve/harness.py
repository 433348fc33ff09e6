"""Helpers for the server tests: real uvicorn servers on 127.0.0.1 around tiny in-process engines.

Each server runs uvicorn in a thread on a socket bound here (a free port, loopback only) and owns its
engine (one engine loop thread per engine).  ``gated`` makes an engine's decode wait for a gate the
test opens, which holds requests in flight deterministically (saturation, disconnects, shutdown).
"""

from __future__ import annotations

import contextlib
import io
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import soundfile as sf

from oasr.engine import Engine, EngineConfig
from oasr.serve.app import create_app
from oasr.serve.server import OasrServer, uvicorn_config
from oasr.serve.settings import ServerSettings
from tests.helpers import REPO, ensure_tinyctc_importable, tinyctc_registered

ensure_tinyctc_importable()

from oasr_tinyctc.convert import write_checkpoint  # noqa: E402

API_KEY = "test-key"
MODEL_NAME = "tinyctc-test"
SAMPLE = REPO / "samples" / "sample.wav"
#: every wait in these tests is bounded by this many seconds
WAIT = 30.0


class ServerThread:
    """uvicorn serving ``app`` on 127.0.0.1 in a daemon thread."""

    def __init__(self, app, *, grace: float | None = None):
        """``grace`` is accepted for old call sites; the app's ``shutdown_grace`` setting governs."""
        self.app = app
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.server = OasrServer(uvicorn_config(app, app.state.oasr.settings, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def state(self):
        return self.app.state.oasr

    def start(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + WAIT
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(WAIT)
        self.sock.close()


def tinyctc_engine(path: Path, **config) -> Engine:
    """An engine on a random tinyctc checkpoint (the architecture is registered only while it loads)."""
    with tinyctc_registered():
        if not (path / "tinyctc.json").exists():
            write_checkpoint(path, seed=5)
        return Engine(EngineConfig(model=str(path), **config))


@contextlib.contextmanager
def serving(engine: Engine, **settings) -> Iterator[ServerThread]:
    settings.setdefault("served_model_names", (MODEL_NAME,))
    settings.setdefault("shutdown_grace", 5.0)
    server = ServerThread(create_app(engine, ServerSettings(**settings)))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def gated(engine: Engine) -> Iterator[threading.Event]:
    """Hold every decode of ``engine`` until the yielded event is set (always set on exit)."""
    gate = threading.Event()
    original = engine.strategy.decode

    def decode(batch):
        if not gate.wait(WAIT):
            raise RuntimeError("test gate was never opened")
        return original(batch)

    engine.strategy.decode = decode
    try:
        yield gate
    finally:
        gate.set()
        engine.strategy.decode = original


def wav_bytes(samples: np.ndarray, rate: int = 16000, subtype: str = "PCM_16") -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format="WAV", subtype=subtype)
    return buf.getvalue()


def wait_until(predicate, what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


class ServeProcess:
    """A running ``oasr serve`` subprocess: its ``port``, and its ``stderr`` once it has stopped."""

    def __init__(self, proc: subprocess.Popen, port: int):
        self.proc, self.port, self.stderr = proc, port, ""


@contextlib.contextmanager
def oasr_serve_process(args: list[str], *, ready_seconds: float = 180.0,
                       command: list[str] | None = None) -> Iterator[ServeProcess]:
    """``oasr serve ARGS --port P`` in a subprocess on a free loopback port, yielded once ``/ready`` answers
    200; stopped with SIGTERM afterwards, and its stderr must then carry no traceback.  ``command`` replaces
    ``python -m oasr.cli serve`` (ARGS follow it), e.g. an interpreter that registers a test plugin first."""
    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = command or [sys.executable, "-m", "oasr.cli", "serve"]
    proc = subprocess.Popen([*command, *args, "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    served = ServeProcess(proc, port)
    try:
        deadline = time.monotonic() + ready_seconds
        while True:
            assert proc.poll() is None, proc.communicate()[1]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "oasr serve did not become ready"
            time.sleep(0.2)
        yield served
        proc.send_signal(signal.SIGTERM)
        _, served.stderr = proc.communicate(timeout=WAIT)
        assert "Traceback" not in served.stderr, served.stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def check_transcribe_cli_equals_engine(model_dir: Path, samples: np.ndarray, tmp_path: Path, capsys) -> None:
    """``oasr transcribe WAV --model DIR -f json`` prints the in-process engine's text for ``samples`` (16 kHz)."""
    import json

    from oasr.cli import main

    wav = tmp_path / "clip.wav"
    sf.write(wav, samples, 16000)
    expected = Engine(EngineConfig(model=str(model_dir))).transcribe_outputs(str(wav))
    assert expected.text
    code = main(["transcribe", str(wav), "--model", str(model_dir), "-f", "json", "--no-progress"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert json.loads(captured.out)["text"] == expected.text


def check_served_text_equals_engine(model_dir: Path, samples: np.ndarray, name: str) -> None:
    """The served model ``name`` answers the openai SDK with the in-process engine's text for ``samples``."""
    import openai

    engine = Engine(EngineConfig(model=str(model_dir)))
    audio = wav_bytes((samples * 32767).astype("int16"))
    expected = engine.transcribe_outputs(audio)
    with serving(engine, served_model_names=(name,)) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=WAIT)
        result = client.audio.transcriptions.create(file=("clip.wav", audio), model=name)
    assert expected.text and result.text == expected.text


def check_realtime_transcripts(port: int, audio: dict[str, np.ndarray], expected: dict[str, str]) -> None:
    """One realtime WebSocket session per int16 16 kHz clip of ``audio``, all at once, on the ``oasr serve`` at
    ``port``: each session's completed transcript equals ``expected[name]`` and its deltas join into it."""
    import asyncio

    from websockets.asyncio.client import connect

    from tests.serve.test_realtime import Session, chunks

    async def one(samples: np.ndarray):
        async with connect(f"ws://127.0.0.1:{port}/v1/realtime", open_timeout=WAIT) as ws:
            s = Session(ws)
            assert (await s.recv())["type"] == "session.created"
            await s.send("session.update", session={"type": "transcription", "audio": {"input": {
                "format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": None}}})
            assert (await s.recv())["type"] == "session.updated"
            for chunk in chunks(np.asarray(samples), 16000, 0.1):
                await s.send("input_audio_buffer.append", audio=chunk)
            await s.send("input_audio_buffer.commit")
            return await s.until("conversation.item.input_audio_transcription.completed")

    async def all_sessions():
        return await asyncio.wait_for(asyncio.gather(*(one(samples) for samples in audio.values())), 4 * WAIT)

    for name, events in zip(audio, asyncio.run(all_sessions()), strict=True):
        completed = events[-1]
        deltas = [e["delta"] for e in events if e["type"].endswith(".delta")]
        assert completed["transcript"] == expected[name]
        assert deltas and "".join(deltas).strip() == completed["transcript"].strip()

