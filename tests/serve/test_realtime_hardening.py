"""Realtime robustness: malformed events keep the session open, buffers and sessions are capped, and a
shutdown ends each open item with an event before the close.  All traffic on 127.0.0.1, bounded waits."""

from __future__ import annotations

import asyncio
import base64
import json

import httpx
import numpy as np
import pytest
import soundfile as sf
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.serve.harness import MODEL_NAME, SAMPLE, WAIT, gated, serving, tinyctc_engine, wait_until


@pytest.fixture(scope="module")
def pcm() -> np.ndarray:
    samples, rate = sf.read(SAMPLE, dtype="int16")
    return samples[: 2 * rate]


def url(server) -> str:
    return f"ws://127.0.0.1:{server.port}/v1/realtime"


def b64(samples: np.ndarray) -> str:
    return base64.b64encode(samples.astype("<i2").tobytes()).decode()


async def recv(ws) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), WAIT))


async def until(ws, kind: str) -> list[dict]:
    events = []
    for _ in range(1000):
        events.append(await recv(ws))
        if events[-1]["type"] == kind:
            return events
    raise AssertionError(f"no {kind} event")


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 2 * WAIT))


async def _rate16k(ws) -> None:
    await ws.send(json.dumps({"type": "session.update", "session": {"type": "transcription", "audio": {
        "input": {"format": {"type": "audio/pcm", "rate": 16000}}}}}))
    assert (await recv(ws))["type"] == "session.updated"


MALFORMED = [
    ("deep nesting", "[" * 100000, "invalid_json"),
    ("a 5000-digit integer", '{"type": "input_audio_buffer.clear", "n": 1' + "1" * 5000 + "}", "invalid_json"),
    ("a lone surrogate in event_id", '{"type": "no.such.event", "event_id": "\\udc80"}', "unknown_event"),
    ("a lone surrogate in the language", json.dumps({"type": "session.update", "session": {"audio": {"input": {
        "transcription": {"language": "\ud800"}}}}}), "invalid_value"),
    ("a non-string event_id", '{"type": "no.such.event", "event_id": {"a": [1, 2]}}', "unknown_event"),
]


@pytest.fixture(scope="module")
def rt_server(ckpt_dir):
    engine = tinyctc_engine(ckpt_dir)
    with serving(engine, realtime_max_total_buffer_seconds=3.0, realtime_max_sessions=3) as srv:
        yield srv


def test_malformed_events_get_an_error_and_the_session_stays_open(rt_server, reference, pcm):
    async def scenario():
        async with connect(url(rt_server), open_timeout=WAIT) as ws:
            assert (await recv(ws))["type"] == "session.created"
            codes = []
            for _, text, _ in MALFORMED:
                await ws.send(text)
                event = await recv(ws)
                assert event["type"] == "error", event
                codes.append(event["error"]["code"])
            await _rate16k(ws)
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": b64(pcm)}))
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            done = (await until(ws, "conversation.item.input_audio_transcription.completed"))[-1]
            return codes, done["transcript"]

    codes, transcript = run(scenario())
    assert codes == [code for _, _, code in MALFORMED]
    assert transcript == reference.transcribe(pcm.astype(np.float32) / 32768.0, sample_rate=16000)


def test_the_server_wide_buffer_cap_holds_across_sessions(rt_server, pcm):
    """3 s of uncommitted audio over all sessions: a second session's append past it is refused until the
    first session clears its buffer."""
    two_seconds = b64(pcm)

    async def scenario():
        async with connect(url(rt_server), open_timeout=WAIT) as a, connect(url(rt_server), open_timeout=WAIT) as b:
            for ws in (a, b):
                await recv(ws)
                await _rate16k(ws)
            await a.send(json.dumps({"type": "input_audio_buffer.append", "audio": two_seconds}))
            await b.send(json.dumps({"type": "input_audio_buffer.append", "audio": two_seconds}))
            refused = await recv(b)
            buffered = rt_server.state.buffered_seconds
            await a.send(json.dumps({"type": "input_audio_buffer.clear"}))
            assert (await recv(a))["type"] == "input_audio_buffer.cleared"
            await b.send(json.dumps({"type": "input_audio_buffer.append", "audio": two_seconds}))
            await b.send(json.dumps({"type": "input_audio_buffer.clear"}))
            after = await recv(b)
            return refused, buffered, after

    refused, buffered, after = run(scenario())
    assert refused["type"] == "error" and refused["error"]["code"] == "server_buffers_full", refused
    assert buffered == pytest.approx(2.0)
    assert after["type"] == "input_audio_buffer.cleared", after  # the retried append was accepted
    wait_until(lambda: rt_server.state.buffered_seconds == 0, "the buffers to be released")


def test_the_session_cap_refuses_the_next_handshake(rt_server):
    async def scenario():
        opened = [await connect(url(rt_server), open_timeout=WAIT) for _ in range(3)]
        try:
            with pytest.raises(InvalidStatus) as refused:
                await connect(url(rt_server), open_timeout=WAIT)
            return refused.value.response.status_code, json.loads(refused.value.response.body)
        finally:
            for ws in opened:
                await ws.close()

    status, body = run(scenario())
    assert status == 429 and "realtime_max_sessions" in body["error"]["message"]


def test_shutdown_ends_open_items_and_streams_with_their_error_events(ckpt_dir, pcm, speech):
    """Past the grace: the realtime item in transcription gets its failed event, the buffering one an
    error event, the SSE stream an error event then [DONE], all before the connections close."""
    engine = tinyctc_engine(ckpt_dir)
    events: list[dict] = []
    sse: list[str] = []

    async def realtime(srv):
        async with connect(url(srv), open_timeout=WAIT) as ws:
            await recv(ws)
            await _rate16k(ws)
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": b64(pcm)}))
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": b64(pcm[:1600])}))
            try:
                for _ in range(20):
                    events.append(await recv(ws))
            except ConnectionClosed:
                pass

    def stream(srv):
        with httpx.stream("POST", f"{srv.url}/v1/audio/transcriptions", files={"file": ("a.wav", speech)},
                          data={"model": MODEL_NAME, "stream": "true"}, timeout=WAIT) as response:
            sse.extend(line for line in response.iter_lines() if line)

    with serving(engine, shutdown_grace=0.5) as srv, gated(engine):
        async def scenario():
            rt = asyncio.ensure_future(realtime(srv))
            sse_task = asyncio.ensure_future(asyncio.to_thread(stream, srv))
            await asyncio.to_thread(wait_until, lambda: srv.state.in_flight == 2, "two requests in flight")
            srv.server.should_exit = True
            await asyncio.wait_for(asyncio.gather(rt, sse_task), WAIT)

        run(scenario())
    kinds = [e["type"] for e in events]
    assert "input_audio_buffer.committed" in kinds
    failed = [e for e in events if e["type"] == "conversation.item.input_audio_transcription.failed"]
    assert failed and failed[0]["error"]["type"] == "server_error", events
    assert any(e["type"] == "error" and e["error"]["code"] == "shutting_down" for e in events), events
    assert sse[-1] == "data: [DONE]" and json.loads(sse[-2][len("data: "):])["error"]["code"] == "aborted", sse
