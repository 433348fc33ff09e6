"""``WS /v1/realtime`` driven by a ``websockets`` client: OpenAI's transcription events, errors, limits.

These run against the offline tinyctc engine (a committed buffer is transcribed as one request); the
streaming-engine test (deltas while audio is still arriving) is in ``test_realtime_streaming.py``.
"""

from __future__ import annotations

import asyncio
import base64
import json

import numpy as np
import pytest
import soundfile as sf
import soxr
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests.serve.harness import API_KEY, MODEL_NAME, SAMPLE, WAIT, gated, wait_until

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def ws_url(server, query: str = "") -> str:
    return f"ws://127.0.0.1:{server.port}/v1/realtime{query}"


@pytest.fixture(scope="module")
def pcm16k() -> np.ndarray:
    samples, rate = sf.read(SAMPLE, dtype="int16")
    assert rate == 16000
    return samples[: 2 * rate]


@pytest.fixture(scope="module")
def pcm24k(pcm16k) -> np.ndarray:
    resampled = soxr.resample(pcm16k.astype(np.float32) / 32768.0, 16000, 24000)
    return np.clip(np.round(resampled * 32768.0), -32768, 32767).astype(np.int16)


def chunks(pcm: np.ndarray, rate: int, seconds: float = 0.1) -> list[str]:
    step = int(rate * seconds)
    return [base64.b64encode(pcm[i:i + step].astype("<i2").tobytes()).decode() for i in range(0, len(pcm), step)]


class Session:
    """A bounded event reader over one connection."""

    def __init__(self, ws):
        self.ws = ws

    async def send(self, type: str, **fields) -> None:
        await self.ws.send(json.dumps({"type": type, **fields}))

    async def recv(self) -> dict:
        return json.loads(await asyncio.wait_for(self.ws.recv(), WAIT))

    async def until(self, *types: str) -> list[dict]:
        """Events up to and including the first of ``types``."""
        events = []
        for _ in range(10_000):
            event = await self.recv()
            events.append(event)
            if event["type"] in types:
                return events
        raise AssertionError(f"no {types} event")


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 2 * WAIT))


def expected_text(reference, pcm: np.ndarray, rate: int) -> str:
    return reference.transcribe(pcm.astype(np.float32) / 32768.0, sample_rate=rate)


async def _transcribe_ga(server, pcm, rate):
    async with connect(ws_url(server), additional_headers=AUTH, open_timeout=WAIT) as ws:
        s = Session(ws)
        created = await s.recv()
        assert created["type"] == "session.created" and created["session"]["type"] == "transcription"
        await s.send("session.update", session={"type": "transcription", "audio": {"input": {
            "format": {"type": "audio/pcm", "rate": rate}, "transcription": {"model": MODEL_NAME},
            "turn_detection": None}}})
        updated = await s.recv()
        assert updated["type"] == "session.updated", updated
        assert updated["session"]["audio"]["input"]["format"]["rate"] == rate
        for chunk in chunks(pcm, rate):
            await s.send("input_audio_buffer.append", audio=chunk)
        await s.send("input_audio_buffer.commit")
        return await s.until("conversation.item.input_audio_transcription.completed")


@pytest.mark.parametrize("rate", [16000, 24000])
def test_committed_buffer_is_transcribed(server, reference, pcm16k, pcm24k, rate):
    pcm = pcm16k if rate == 16000 else pcm24k
    events = run(_transcribe_ga(server, pcm, rate))
    types = [e["type"] for e in events]
    assert types[0] == "input_audio_buffer.committed" and types[-1].endswith(".completed")
    item_id = events[0]["item_id"]
    assert all(e["item_id"] == item_id for e in events)
    completed = events[-1]
    deltas = "".join(e["delta"] for e in events if e["type"].endswith(".delta"))
    want = expected_text(reference, pcm, rate)
    assert len(want) > 3 and completed["transcript"] == deltas == want
    assert completed["usage"] == {"type": "duration", "seconds": pytest.approx(len(pcm) / rate, abs=1e-3)}


def test_beta_transcription_session_update_at_24khz(server, reference, pcm24k):
    async def scenario():
        async with connect(ws_url(server, f"?model={MODEL_NAME}&intent=transcription"), additional_headers=AUTH,
                           open_timeout=WAIT) as ws:
            s = Session(ws)
            await s.recv()
            await s.send("transcription_session.update", session={
                "input_audio_format": "pcm16", "input_audio_transcription": {"model": MODEL_NAME},
                "turn_detection": None})
            assert (await s.recv())["type"] == "transcription_session.updated"
            first = None
            for _ in range(2):  # two items on one session, chained by previous_item_id
                for chunk in chunks(pcm24k, 24000, 0.25):
                    await s.send("input_audio_buffer.append", audio=chunk)
                await s.send("input_audio_buffer.commit")
                events = await s.until("conversation.item.input_audio_transcription.completed")
                committed = events[0]
                assert committed["previous_item_id"] == first
                first = committed["item_id"]
                yield events[-1]["transcript"]

    async def collect():
        return [t async for t in scenario()]

    assert run(collect()) == [expected_text(reference, pcm24k, 24000)] * 2


def test_errors_are_events_and_the_session_survives(server, reference, pcm16k):
    async def scenario():
        async with connect(ws_url(server), additional_headers=AUTH, open_timeout=WAIT) as ws:
            s = Session(ws)
            await s.recv()
            errors = {}
            await ws.send("{not json")
            errors["json"] = await s.recv()
            await s.send("response.create", event_id="evt_1")
            errors["unknown"] = await s.recv()
            await s.send("input_audio_buffer.commit")
            errors["empty"] = await s.recv()
            await s.send("input_audio_buffer.append", audio="***")
            errors["base64"] = await s.recv()
            await s.send("input_audio_buffer.append", audio=base64.b64encode(b"\x01\x02\x03").decode())
            errors["odd"] = await s.recv()
            await s.send("session.update", session={"type": "transcription", "audio": {"input": {
                "turn_detection": {"type": "semantic_vad"}}}})  # server_vad is served: tests/vad/test_server_vad.py
            errors["vad"] = await s.recv()
            await s.send("session.update", session={"type": "transcription", "audio": {"input": {
                "format": {"type": "audio/pcm", "rate": 44100}}}})
            errors["rate"] = await s.recv()
            await s.send("session.update", session={"type": "transcription", "audio": {"input": {
                "transcription": {"model": "gpt-4o-transcribe"}}}})
            errors["model"] = await s.recv()
            await ws.send(b"\x00\x01")
            errors["binary"] = await s.recv()
            # append then clear: the buffer is empty again
            await s.send("input_audio_buffer.append", audio=chunks(pcm16k, 16000)[0])
            await s.send("input_audio_buffer.clear")
            cleared = await s.recv()
            await s.send("input_audio_buffer.commit")
            errors["cleared"] = await s.recv()
            # and the session still transcribes
            await s.send("session.update", session={"type": "transcription", "audio": {"input": {
                "format": {"type": "audio/pcm", "rate": 16000}}}})
            await s.recv()
            for chunk in chunks(pcm16k, 16000):
                await s.send("input_audio_buffer.append", audio=chunk)
            await s.send("input_audio_buffer.commit")
            events = await s.until("conversation.item.input_audio_transcription.completed")
            return errors, cleared, events[-1]["transcript"]

    errors, cleared, transcript = run(scenario())
    assert all(e["type"] == "error" for e in errors.values()), errors
    codes = {k: e["error"]["code"] for k, e in errors.items()}
    assert codes == {"json": "invalid_json", "unknown": "unknown_event", "empty": "input_audio_buffer_commit_empty",
                     "base64": "invalid_value", "odd": "invalid_value", "vad": "invalid_value",
                     "rate": "invalid_value", "model": "model_not_found", "binary": "invalid_event",
                     "cleared": "input_audio_buffer_commit_empty"}
    assert errors["unknown"]["error"]["event_id"] == "evt_1"
    assert errors["vad"]["error"]["param"] == "session.audio.input.turn_detection.type"
    assert "gpt-4o-transcribe" in errors["model"]["error"]["message"]
    assert cleared["type"] == "input_audio_buffer.cleared"
    assert transcript == expected_text(reference, pcm16k, 16000)


def test_handshake_refusals(server):
    async def status(url, **kwargs):
        try:
            async with connect(url, open_timeout=WAIT, **kwargs):
                return 101
        except InvalidStatus as exc:
            return exc.response.status_code, json.loads(exc.response.body)["error"]["code"]

    assert run(status(ws_url(server))) == (401, "invalid_api_key")
    assert run(status(ws_url(server), additional_headers={"Authorization": "Bearer nope"})) == (401, "invalid_api_key")
    assert run(status(ws_url(server, "?model=whisper-1"), additional_headers=AUTH)) == (404, "model_not_found")
    # the browser form of the key: a subprotocol
    assert run(status(ws_url(server), subprotocols=["realtime", f"openai-insecure-api-key.{API_KEY}"])) == 101


def test_disconnect_frees_the_item_in_transcription(server, pcm24k):
    engine = server.state.engine
    aborted = engine.metrics.finished["abort"]

    async def scenario():
        async with connect(ws_url(server), additional_headers=AUTH, open_timeout=WAIT) as ws:
            s = Session(ws)
            await s.recv()
            for chunk in chunks(pcm24k, 24000):
                await s.send("input_audio_buffer.append", audio=chunk)
            await s.send("input_audio_buffer.commit")
            assert (await s.recv())["type"] == "input_audio_buffer.committed"
            await asyncio.to_thread(wait_until, lambda: server.state.in_flight == 1, "the item to be in flight")

    with gated(engine):
        run(scenario())
        wait_until(lambda: server.state.in_flight == 0, "the item to be freed")
        wait_until(lambda: engine.metrics.finished["abort"] == aborted + 1, "the engine request to be aborted")
        assert not server.state.runner.in_flight
