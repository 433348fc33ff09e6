"""Startup, readiness, graceful shutdown, and the ``oasr serve`` command itself."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import textwrap
import threading

import httpx
import openai
import pytest

from oasr.engine import EngineConfig
from oasr.serve.app import create_app
from oasr.serve.settings import ServerSettings
from tests.helpers import TINYCTC_SRC
from tests.helpers import tinyctc_registered as tinyctc_block
from tests.serve.harness import (
    MODEL_NAME,
    WAIT,
    ServerThread,
    gated,
    oasr_serve_process,
    serving,
    tinyctc_engine,
    wait_until,
)


def post(server, audio: bytes, **kwargs) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/audio/transcriptions", files={"file": ("a.wav", audio)},
                      data={"model": MODEL_NAME}, timeout=WAIT, **kwargs)


def test_shutdown_lets_in_flight_requests_finish(tmp_path, reference, speech):
    engine = tinyctc_engine(tmp_path / "ckpt")
    server = ServerThread(create_app(engine, ServerSettings(served_model_names=(MODEL_NAME,), shutdown_grace=10)),
                          grace=10).start()
    responses: list[httpx.Response] = []
    try:
        with gated(engine) as gate:
            request = threading.Thread(target=lambda: responses.append(post(server, speech)))
            request.start()
            wait_until(lambda: server.state.in_flight == 1, "the request to be in flight")
            server.server.should_exit = True  # what SIGTERM does
            wait_until(lambda: _refused(server.port), "the listening socket to close")
            gate.set()
            request.join(WAIT)
        server.thread.join(WAIT)
        assert not server.thread.is_alive()
    finally:
        server.stop()
    assert responses[0].status_code == 200 and responses[0].json()["text"] == reference.transcribe(speech)
    assert not server.state.runner.alive and engine.metrics.finished["abort"] == 0


def test_shutdown_aborts_what_outlives_the_grace_period(tmp_path, speech):
    engine = tinyctc_engine(tmp_path / "ckpt")
    server = ServerThread(create_app(engine, ServerSettings(served_model_names=(MODEL_NAME,), shutdown_grace=0.5)),
                          grace=0.5).start()
    outcome: list = []

    def call() -> None:
        try:
            outcome.append(post(server, speech).status_code)
        except httpx.HTTPError as exc:
            outcome.append(type(exc).__name__)

    try:
        with gated(engine):
            request = threading.Thread(target=call)
            request.start()
            wait_until(lambda: server.state.in_flight == 1, "the request to be in flight")
            server.server.should_exit = True
            request.join(WAIT)
            assert outcome and outcome[0] != 200
            wait_until(lambda: engine.metrics.finished["abort"] == 1, "the engine request to be aborted")
        server.thread.join(WAIT)
    finally:
        server.stop()


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return True
    return False


@pytest.fixture
def tinyctc_registered():
    with tinyctc_block():
        yield


def test_an_app_from_a_config_loads_in_the_background(tinyctc_registered, ckpt_dir, reference, speech):
    app = create_app(EngineConfig(model=str(ckpt_dir)), ServerSettings())
    server = ServerThread(app).start()
    try:
        assert httpx.get(f"{server.url}/health", timeout=WAIT).status_code == 200
        wait_until(lambda: httpx.get(f"{server.url}/ready", timeout=WAIT).status_code == 200, "the model to load")
        # no API key configured: open; the served name is the checkpoint directory's name
        response = httpx.post(f"{server.url}/v1/audio/transcriptions", files={"file": ("a.wav", speech)},
                              data={"model": ckpt_dir.name}, timeout=WAIT)
        assert response.status_code == 200 and response.json()["text"] == reference.transcribe(speech)
    finally:
        server.stop()


def test_a_model_that_fails_to_load_is_reported(speech, tmp_path):
    app = create_app(EngineConfig(model=str(tmp_path / "missing")), ServerSettings(served_model_names=("m",)))
    server = ServerThread(app).start()
    try:
        wait_until(lambda: app.state.oasr.load_error is not None, "the load to fail")
        ready = httpx.get(f"{server.url}/ready", timeout=WAIT)
        assert ready.status_code == 503 and ready.json()["status"] == "failed"
        assert "missing" in ready.json()["detail"]
        response = httpx.post(f"{server.url}/v1/audio/transcriptions", files={"file": ("a.wav", speech)}, timeout=WAIT)
        assert response.status_code == 503 and response.json()["error"]["code"] == "model_load_failed"
    finally:
        server.stop()


def test_readiness_follows_the_engine_loop(tmp_path):
    engine = tinyctc_engine(tmp_path / "ckpt")
    with serving(engine) as server:
        assert httpx.get(f"{server.url}/ready", timeout=WAIT).status_code == 200
        server.state.runner.draining = True
        ready = httpx.get(f"{server.url}/ready", timeout=WAIT)
        assert ready.status_code == 503 and ready.json()["status"] == "draining"
        refused = post(server, b"RIFF")
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"


def _tinyctc_serve() -> list[str]:
    """``oasr serve`` in a fresh interpreter with the example plugin's tinyctc architecture registered; its
    arguments follow."""
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(TINYCTC_SRC)!r})
        from oasr.models import register_model
        register_model("tinyctc", "oasr_tinyctc.model:TinyCtcModel", "oasr_tinyctc.model:TinyCtcConfig",
                       "oasr_tinyctc.convert:TinyCtcConverter")
        from oasr.cli import main
        sys.exit(main(["serve", *sys.argv[1:]]))
    """)
    return [sys.executable, "-c", code]


@pytest.mark.slow
def test_oasr_serve_command(ckpt_dir, reference, speech):
    """The real command: serves, answers the SDK, and shuts down cleanly on SIGTERM."""
    expected = reference.transcribe(speech)
    with oasr_serve_process(["--model", str(ckpt_dir), "--served-model-name", "tiny", "--api-key", "k",
                             "--threads", "1", "--no-access-log", "--log-level", "warning"],
                            ready_seconds=120, command=_tinyctc_serve()) as served:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{served.port}/v1", api_key="k", max_retries=0,
                               timeout=WAIT)
        assert [m.id for m in client.models.list()] == ["tiny"]
        assert client.audio.transcriptions.create(file=("a.wav", speech), model="tiny").text == expected
    # uvicorn re-raises the signal once it has shut down, so the exit status is the usual one for SIGTERM
    assert served.proc.returncode == -signal.SIGTERM, served.stderr
    assert f"serving tiny (tinyctc, ctc, offline) on http://127.0.0.1:{served.port}/v1" in served.stderr


def test_oasr_serve_refuses_a_bad_model_at_once(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([*_tinyctc_serve(), "--model", str(tmp_path / "nope"), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "oasr: error:" in stderr and "nope" in stderr
