"""Bad requests get the documented status and OpenAI-shaped message; good requests keep succeeding.

Each case is sent between two good requests to the same server, and the good ones must return the
expected transcript (a bad request must not disturb the engine or leak a concurrency slot).
"""

from __future__ import annotations

import io
import json
import os
import socket

import h11
import httpx
import numpy as np
import openai
import pytest
import soundfile as sf

from tests.serve.harness import API_KEY, MODEL_NAME, WAIT, wav_bytes

URL = "/v1/audio/transcriptions"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


def _zero_second_wav() -> bytes:
    return wav_bytes(np.zeros(0, dtype=np.int16))


def _nan_float_wav() -> bytes:
    samples = np.random.default_rng(0).uniform(-0.5, 0.5, 16000).astype(np.float32)
    samples[4000:4100] = np.nan
    return wav_bytes(samples, subtype="FLOAT")


def _files(audio: bytes) -> dict:
    return {"file": ("audio.wav", audio, "audio/wav")}


#: (id, request kwargs for httpx.post, status, error param, substring of the message)
CASES = [
    ("truncated-wav-header", lambda s: {"files": _files(s[:30])}, 415, "file",
     "uploaded file 'audio.wav': could not decode audio"),
    ("random-bytes", lambda s: {"files": _files(os.urandom(4096))}, 415, "file", "could not decode audio"),
    ("empty-file", lambda s: {"files": _files(b"")}, 400, "file", "empty"),
    ("zero-second-audio", lambda s: {"files": _files(_zero_second_wav())}, 415, "file", "samples"),
    ("nan-float-wav", lambda s: {"files": _files(_nan_float_wav())}, 415, "file", "non-finite"),
    ("temperature-not-a-number", lambda s: {"files": _files(s), "data": {"temperature": "hot"}}, 400, "temperature",
     "number between 0 and 1"),
    ("temperature-out-of-range", lambda s: {"files": _files(s), "data": {"temperature": "3"}}, 400, "temperature",
     "number between 0 and 1"),
    ("unknown-response-format", lambda s: {"files": _files(s), "data": {"response_format": "xml"}}, 400,
     "response_format", "must be one of"),
    ("stream-not-a-boolean", lambda s: {"files": _files(s), "data": {"stream": "maybe"}}, 400, "stream",
     "true or false"),
    ("granularity-without-verbose-json", lambda s: {"files": _files(s), "data": {"timestamp_granularities[]": "word"}},
     400, "timestamp_granularities[]", "verbose_json"),
    ("unknown-granularity", lambda s: {"files": _files(s), "data": {"response_format": "verbose_json",
                                                                     "timestamp_granularities[]": "char"}},
     400, "timestamp_granularities[]", "segment or word"),
    ("file-as-text-field", lambda s: {"data": {"file": "hello"}, "files": {"model": (None, MODEL_NAME)}}, 400, "file",
     "must be a file upload"),
    ("model-as-file", lambda s: {"files": {**_files(s), "model": ("m.txt", b"x")}}, 400, "model", "text field"),
    ("missing-file", lambda s: {"files": {"model": (None, MODEL_NAME)}}, 400, "file", "is required"),
    ("unknown-field", lambda s: {"files": _files(s), "data": {"speed": "2"}}, 400, "speed", "unsupported field"),
    ("option-the-model-cannot-honour", lambda s: {"files": _files(s), "data": {"language": "fr"}}, 400, "language",
     "cannot honour"),
    ("not-multipart", lambda s: {"json": {"file": "x"}}, 400, None, "multipart/form-data"),
    ("huge-upload", lambda s: {"files": _files(os.urandom(3 * 2**20))}, 413, "file", "larger than"),
    ("unknown-model", lambda s: {"files": _files(s), "data": {"model": "whisper-1"}}, 404, "model", "does not exist"),
]


def _good(server, speech: bytes, expected_text: str) -> None:
    response = httpx.post(server.url + URL, headers=AUTH, files=_files(speech), data={"model": MODEL_NAME},
                          timeout=WAIT)
    assert response.status_code == 200, response.text
    assert response.json()["text"] == expected_text


@pytest.fixture(scope="module")
def expected_text(reference, speech) -> str:
    return reference.transcribe(speech)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_request_between_good_ones(server, speech, expected_text, case):
    _, make, status, param, fragment = case
    _good(server, speech, expected_text)
    kwargs = make(speech)
    if "data" in kwargs or "json" not in kwargs:
        kwargs["data"] = {"model": MODEL_NAME, **kwargs.get("data", {})}
        if "model" in kwargs.get("files", {}):
            kwargs["data"].pop("model")
    response = httpx.post(server.url + URL, headers=AUTH, timeout=WAIT, **kwargs)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and fragment in error["message"], error
    _good(server, speech, expected_text)
    assert server.state.in_flight == 0


def test_truncated_wav_data_decodes_what_is_there(server, reference, speech):
    """A WAV cut short inside its data chunk is readable up to the cut (libsndfile's behaviour)."""
    cut = speech[: len(speech) // 2]
    samples, _ = sf.read(io.BytesIO(cut), dtype="float32")
    response = httpx.post(server.url + URL, headers=AUTH, files=_files(cut),
                          data={"model": MODEL_NAME, "response_format": "verbose_json"}, timeout=WAIT)
    assert response.status_code == 200, response.text
    assert response.json()["duration"] == pytest.approx(len(samples) / 16000, abs=1e-3)
    assert response.json()["text"] == reference.transcribe(cut)


def test_the_sdk_sees_the_same_errors(server, speech):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=WAIT)
    with pytest.raises(openai.APIStatusError) as info:
        client.audio.transcriptions.create(file=("noise.bin", os.urandom(2048)), model=MODEL_NAME)
    assert info.value.status_code == 415 and info.value.body["code"] == "invalid_audio"
    with pytest.raises(openai.APIStatusError) as info:
        client.audio.transcriptions.create(file=("big.wav", os.urandom(3 * 2**20)), model=MODEL_NAME)
    assert info.value.status_code == 413 and info.value.body["code"] == "file_too_large"
    with pytest.raises(openai.NotFoundError) as info:
        client.audio.transcriptions.create(file=("a.wav", speech), model="whisper-1")
    assert "tinyctc-test" in info.value.body["message"]


def test_a_declared_oversized_body_is_refused_before_it_is_read(server):
    """Content-Length over the limit: 413 at once, though not one byte of the body was sent."""
    conn = h11.Connection(our_role=h11.CLIENT)
    headers = [("Host", "127.0.0.1"), ("Authorization", f"Bearer {API_KEY}"),
               ("Content-Type", "multipart/form-data; boundary=x"), ("Content-Length", str(50 * 2**20))]
    with socket.create_connection(("127.0.0.1", server.port), timeout=WAIT) as sock:
        sock.sendall(conn.send(h11.Request(method="POST", target=URL, headers=headers)))
        response, body = None, b""
        for _ in range(1000):  # bounded: a response is a handful of events
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(sock.recv(65536))
            elif isinstance(event, h11.Response):
                response = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                break
    assert response is not None and response.status_code == 413
    assert json.loads(body)["error"]["code"] == "file_too_large"
