"""Hostile and unusual clients: decoded-size limits, slow uploads, abandoned work, shutdown, realtime abuse.

Every network connection is to 127.0.0.1; every loop and wait is bounded.
"""

from __future__ import annotations

import io
import socket
import threading
import time

import httpx
import numpy as np
import pytest
import soundfile as sf

from oasr import audio
from oasr.errors import AudioError
from oasr.serve.app import create_app
from oasr.serve.settings import ServerSettings
from tests.serve.harness import MODEL_NAME, WAIT, ServerThread, gated, serving, tinyctc_engine, wait_until


def _silence_flac(path, rate: int, channels: int, seconds: int):
    block = np.zeros((rate, channels), dtype=np.int16)
    with sf.SoundFile(path, "w", samplerate=rate, channels=channels, format="FLAC", subtype="PCM_16") as f:
        for _ in range(seconds):
            f.write(block)
    return path.read_bytes()


def test_the_engine_limit_refuses_a_bomb_before_decoding_it(ckpt_dir, tmp_path, monkeypatch):
    """--max-audio-seconds 30 holds from the container's metadata: not one sample of 8 × 96 kHz is decoded."""
    engine = tinyctc_engine(ckpt_dir, max_audio_seconds=30)
    bomb = _silence_flac(tmp_path / "bomb.flac", 96000, 8, 40)
    monkeypatch.setattr(audio._Decoded, "add", lambda *a: pytest.fail("decoded a sample"))
    with pytest.raises(AudioError, match=r"40 s long, over the limit of 30 s \(EngineConfig.max_audio_seconds"):
        engine.add_request(bomb)


# -- slow clients ---------------------------------------------------------------------------------------------
def _upload_bytes(server, audio: bytes) -> tuple[bytes, bytes]:
    """(request head, body) of a transcription upload, as bytes to send by hand."""
    request = httpx.Request("POST", f"{server.url}/v1/audio/transcriptions", files={"file": ("a.wav", audio)},
                            data={"model": MODEL_NAME})
    body = request.read()
    head = f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n" + "".join(
        f"{k}: {v}\r\n" for k, v in request.headers.items() if k.lower() != "host") + "\r\n"
    return head.encode(), body


def _connect(server) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=WAIT)
    sock.settimeout(0.2)
    return sock


def _closed_or_answered(sock: socket.socket, drip: bytes, seconds: float) -> bytes | None:
    """Drip ``drip`` every 0.2 s for at most ``seconds``; what the server sent (b'' = closed), or None."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            data = sock.recv(4096)
            return data
        except TimeoutError:
            pass
        except OSError:
            return b""
        try:
            sock.sendall(drip)
        except OSError:
            return b""
    return None


def test_slow_uploads_do_not_lock_out_good_requests(ckpt_dir, reference, speech):
    """Six uploads trickling their bodies and two trickling their heads, against two concurrency slots: a
    good request still succeeds; the body tricklers get 408 at the body deadline and the head tricklers are
    disconnected at the head deadline."""
    engine = tinyctc_engine(ckpt_dir)
    with serving(engine, max_concurrency=2, body_timeout=2.0, header_timeout=1.0) as srv:
        head, body = _upload_bytes(srv, speech)
        bodies, heads = [], []
        for _ in range(6):
            sock = _connect(srv)
            sock.sendall(head + body[:200])
            bodies.append(sock)
        for _ in range(2):
            sock = _connect(srv)
            sock.sendall(head[:40])
            heads.append(sock)
        wait_until(lambda: srv.state.uploading == 6, "the slow uploads to be received")
        good = httpx.post(f"{srv.url}/v1/audio/transcriptions", files={"file": ("a.wav", speech)},
                          data={"model": MODEL_NAME}, timeout=WAIT)
        assert good.status_code == 200, good.text
        assert good.json()["text"] == reference.transcribe(speech)
        assert srv.state.in_flight == 0
        for sock in heads:
            assert _closed_or_answered(sock, b"X", 6.0) == b"", "a head trickler was not disconnected"
        for sock in bodies:
            answer = _closed_or_answered(sock, b"-", 6.0)
            assert answer is not None and answer.startswith(b"HTTP/1.1 408"), answer
            sock.close()
        wait_until(lambda: srv.state.uploading == 0, "the upload count to return to zero")


def test_the_upload_bound_answers_429_without_reading(ckpt_dir, speech):
    engine = tinyctc_engine(ckpt_dir)
    with serving(engine, max_pending_uploads=2, body_timeout=5.0) as srv:
        head, body = _upload_bytes(srv, speech)
        slow = [_connect(srv) for _ in range(2)]
        for sock in slow:
            sock.sendall(head + body[:100])
        wait_until(lambda: srv.state.uploading == 2, "two uploads in progress")
        refused = httpx.post(f"{srv.url}/v1/audio/transcriptions", files={"file": ("a.wav", speech)},
                             data={"model": MODEL_NAME}, timeout=WAIT)
        assert refused.status_code == 429 and "--max-pending-uploads" in refused.json()["error"]["message"]
        for sock in slow:
            sock.close()
        wait_until(lambda: srv.state.uploading == 0, "the abandoned uploads to be released")
        assert httpx.post(f"{srv.url}/v1/audio/transcriptions", files={"file": ("a.wav", speech)},
                          data={"model": MODEL_NAME}, timeout=WAIT).status_code == 200


# -- cooperative cancellation ---------------------------------------------------------------------------------
def _abort_at_first_call(engine, module, request_id: str):
    """Abort ``request_id`` when ``module`` first runs (the client leaves mid-forward); record module calls."""
    calls: list[str] = []

    def hook(mod, args, output):
        calls.append(type(mod).__name__)
        if len(calls) == 1:
            engine.abort_request(request_id)

    handles = [module.register_forward_hook(hook), engine.model.encoder.norm.register_forward_hook(
        lambda mod, args, output: calls.append("norm"))]
    return calls, handles


def test_an_aborted_request_leaves_its_batch_at_the_next_module(ckpt_dir, speech, reference):
    engine = tinyctc_engine(ckpt_dir, max_batch_size=4)
    long = np.tile(sf.read(io.BytesIO(speech), dtype="float32")[0], 20)
    rid = engine.add_request(long, sample_rate=16000)
    calls, handles = _abort_at_first_call(engine, engine.model.encoder.input_proj, rid)
    try:
        outputs = engine.step(flush=True)
    finally:
        for h in handles:
            h.remove()
    assert outputs == [] and calls == ["Linear"], f"the forward ran on after the abort: {calls}"
    assert engine.metrics.finished["abort"] == 1 and not engine.has_unfinished_requests()
    assert engine.transcribe(speech) == reference.transcribe(speech)  # the engine is unharmed


def test_rows_of_a_partly_aborted_batch_finish_on_their_own(ckpt_dir, speech, reference):
    engine = tinyctc_engine(ckpt_dir, max_batch_size=4, schedule_policy="fcfs")
    gone = engine.add_request(speech)
    kept = engine.add_request(speech)
    calls, handles = _abort_at_first_call(engine, engine.model.encoder.input_proj, gone)
    try:
        outputs = engine.step(flush=True)
    finally:
        for h in handles:
            h.remove()
    assert "norm" in calls  # the batch ran on for the row still wanted
    assert [o.request_id for o in outputs] == [kept] and outputs[0].text == reference.transcribe(speech)


def test_shutdown_answers_without_waiting_for_a_step_that_does_not_end(ckpt_dir, speech):
    """The engine thread is stuck in a decode that no module hook can interrupt (the test gate): the
    request still gets its 503 within the grace, and the server exits in bounded time."""
    engine = tinyctc_engine(ckpt_dir)
    srv = ServerThread(create_app(engine, ServerSettings(served_model_names=(MODEL_NAME,), shutdown_grace=0.5)))
    srv.start()
    answers: list[httpx.Response] = []
    try:
        with gated(engine):
            thread = threading.Thread(target=lambda: answers.append(httpx.post(
                f"{srv.url}/v1/audio/transcriptions", files={"file": ("a.wav", speech)},
                data={"model": MODEL_NAME}, timeout=WAIT)))
            thread.start()
            wait_until(lambda: srv.state.in_flight == 1, "the request to be in flight")
            started = time.monotonic()
            srv.server.should_exit = True
            thread.join(WAIT)
            answered = time.monotonic() - started
            srv.thread.join(WAIT)
            assert not srv.thread.is_alive()
    finally:
        srv.stop()
    assert answers and answers[0].status_code == 503, answers
    assert answers[0].json()["error"]["code"] == "aborted"
    assert answered < WAIT / 2


def test_a_timed_out_request_stops_its_forward(ckpt_dir, speech):
    """--request-timeout: the client gets its 503 and the engine stops computing for it (the forward
    leaves at its next module) instead of decoding for nobody."""
    engine = tinyctc_engine(ckpt_dir)
    calls: list[str] = []

    def slow(module, args):  # every module call of the forward takes 50 ms
        calls.append(type(module).__name__)
        time.sleep(0.05)

    handles = [m.register_forward_pre_hook(slow) for m in engine.model.modules()]  # after the engine's own
    try:
        engine.transcribe(speech)
        full, calls[:] = len(calls), []
        assert full >= 8
        with serving(engine, request_timeout=0.15) as srv:
            response = httpx.post(f"{srv.url}/v1/audio/transcriptions", files={"file": ("a.wav", speech)},
                                  data={"model": MODEL_NAME}, timeout=WAIT)
            assert response.status_code == 503 and response.json()["error"]["code"] == "timeout"
            wait_until(lambda: engine.metrics.finished["abort"] == 1 and not engine.has_unfinished_requests()
                       and not engine._running, "the timed-out request to leave the engine")
    finally:
        for h in handles:
            h.remove()
    assert len(calls) < full, f"the forward ran all {full} module calls for a client that had left"


def test_an_upload_abandoned_during_admission_stops_decoding(ckpt_dir, tmp_path, monkeypatch):
    """The client goes away while its 10-minute upload is being decoded: the decode stops at its next
    block instead of finishing for nobody, and nothing reaches the engine."""
    import asyncio

    from oasr.serve.runner import EngineRunner

    engine = tinyctc_engine(ckpt_dir)
    flac = _silence_flac(tmp_path / "long.flac", 16000, 1, 600)  # 600 one-second blocks
    blocks: list[int] = []
    original = audio._Decoded.add

    def slow_add(self, block, rate):
        blocks.append(block.shape[1])
        time.sleep(0.005)
        return original(self, block, rate)

    monkeypatch.setattr(audio._Decoded, "add", slow_add)
    runner = EngineRunner(engine)
    runner.start()

    async def scenario() -> tuple[int, int]:
        task = asyncio.ensure_future(runner.submit(flac))
        for _ in range(2000):
            if len(blocks) >= 5:
                break
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        seen = len(blocks)
        await asyncio.sleep(0.3)  # undisturbed, the decode would take ~60 more blocks in this time
        return seen, len(blocks)

    try:
        seen, later = asyncio.run(scenario())
    finally:
        runner.stop()
    assert 5 <= seen and later <= seen + 1, (seen, later)
    assert engine.metrics.finished["abort"] == 0 and not engine.has_unfinished_requests()
