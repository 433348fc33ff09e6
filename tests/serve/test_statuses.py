"""Every status of the documented table (oasr.serve.errors) provoked for real, and the request timeout.

Each row of the table in ``oasr/serve/errors.py`` is a case here: a server is made to refuse a request
for that reason and must answer with that status, OpenAI's error shape and the documented ``code``.
"""

from __future__ import annotations

import re
import socket
import time

import httpx
import pytest

import oasr.serve.errors as errors_module
from tests.serve.harness import API_KEY, MODEL_NAME, WAIT, gated, serving, tinyctc_engine

URL = "/v1/audio/transcriptions"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tmp_path_factory.mktemp("statuses") / "ckpt"


@pytest.fixture
def engine(ckpt):
    """A fresh engine per test: a server shuts its engine down when it stops."""
    return tinyctc_engine(ckpt)


def _post(server, speech, *, headers=AUTH, data=None, timeout=WAIT):
    return httpx.post(server.url + URL, headers=headers, files={"file": ("a.wav", speech, "audio/wav")},
                      data={"model": MODEL_NAME, **(data or {})}, timeout=timeout)


def _error(response, status):
    assert response.status_code == status, response.text
    body = response.json()["error"]
    assert set(body) >= {"message", "type", "param", "code"} and body["message"]
    return body


def test_the_table_lists_these_statuses():
    """The cases below cover the documented table; a new row without a case fails here."""
    documented = {int(s) for s in re.findall(r"^(\d{3}) ", errors_module.__doc__, flags=re.M)}
    assert documented == {400, 401, 404, 408, 413, 415, 429, 503, 500}


def test_400_401_404_413_415(engine, speech):
    with serving(engine, api_key=API_KEY, max_upload_bytes=1 << 20) as server:
        assert _error(_post(server, speech, data={"response_format": "xml"}), 400)["param"] == "response_format"
        assert _error(_post(server, speech, headers={}), 401)["code"] == "invalid_api_key"
        assert _error(_post(server, speech, data={"model": "nope"}), 404)["code"] == "model_not_found"
        assert _error(_post(server, b"\0" * (2 << 20)), 413)["code"] == "file_too_large"
        assert _error(_post(server, b"RIFF" + b"\1" * 500), 415)["code"] == "invalid_audio"
        assert _post(server, speech).status_code == 200


def test_408_when_the_body_does_not_arrive_in_time(engine, speech):
    with serving(engine, api_key=API_KEY, body_timeout=0.5) as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=WAIT) as sock:
            sock.sendall(b"POST " + URL.encode() + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + API_KEY.encode()
                         + b"\r\nContent-Type: multipart/form-data; boundary=b\r\nContent-Length: 100000\r\n\r\n--b\r\n")
            reply = sock.recv(65536).decode("latin-1")
        assert reply.startswith("HTTP/1.1 408"), reply[:200]
        assert '"request_timeout"' in reply
        assert _post(server, speech).status_code == 200


def test_429_when_every_concurrency_slot_is_taken(engine, speech):
    import concurrent.futures

    with serving(engine, api_key=API_KEY, max_concurrency=1) as server, gated(engine) as gate:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            held = pool.submit(_post, server, speech)
            deadline = time.monotonic() + WAIT
            while server.state.in_flight == 0 and not held.done():
                assert time.monotonic() < deadline
                time.sleep(0.02)
            body = _error(_post(server, speech), 429)
            assert body["type"] == "rate_limit_error"
            gate.set()
            assert held.result().status_code == 200


def test_503_on_the_request_timeout_and_the_next_request_is_served(engine, speech):
    with serving(engine, api_key=API_KEY, request_timeout=0.5) as server:
        with gated(engine) as gate:
            body = _error(_post(server, speech), 503)
            assert body["code"] == "timeout" and "request timeout (0.5 s)" in body["message"]
            gate.set()
        assert _post(server, speech).status_code == 200


def test_503_when_the_model_failed_to_load(tmp_path):
    from oasr.engine import EngineConfig
    from oasr.serve.app import create_app
    from oasr.serve.settings import ServerSettings
    from tests.serve.harness import ServerThread

    app = create_app(EngineConfig(model=str(tmp_path / "missing")), ServerSettings(served_model_names=(MODEL_NAME,)))
    server = ServerThread(app).start()
    try:
        deadline = time.monotonic() + WAIT
        while server.state.load_error is None:
            assert time.monotonic() < deadline, "the failed load was never reported"
            time.sleep(0.05)
        body = _error(_post(server, b"RIFF", headers={}), 503)
        assert body["type"] == "server_error" and body["code"] == "model_load_failed"
        assert httpx.get(server.url + "/ready", timeout=WAIT).status_code == 503
    finally:
        server.stop()


def test_500_for_a_bug_and_the_server_keeps_serving(engine, speech, monkeypatch):
    import oasr.serve.app as app_module

    def broken(*_args, **_kwargs):
        raise ZeroDivisionError("a bug")

    with serving(engine, api_key=API_KEY) as server:
        monkeypatch.setattr(app_module, "_render", broken)
        body = _error(_post(server, speech), 500)
        assert body["type"] == "server_error"
        monkeypatch.undo()
        assert _post(server, speech).status_code == 200


def test_openai_temperature_zero_is_served_by_a_ctc_model(engine, speech):
    """OpenAI's temperature 0 (its default, which many clients send) means the model's own schedule: a
    CTC model serves it; a sampling temperature it cannot honour is a 400 naming the field."""
    with serving(engine, api_key=API_KEY) as server:
        plain = _post(server, speech)
        assert plain.status_code == 200
        assert _post(server, speech, data={"temperature": "0"}).json() == plain.json()
        assert _error(_post(server, speech, data={"temperature": "0.7"}), 400)["param"] == "temperature"
