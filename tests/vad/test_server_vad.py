"""Realtime ``turn_detection: server_vad``: the OpenAI SDK's realtime client gets one committed turn per
spoken sentence, each transcript equal to offline transcription of that turn's audio."""

from __future__ import annotations

import asyncio
import base64
import json

import numpy as np
import pytest
from websockets.asyncio.client import connect

from tests.serve.harness import API_KEY, MODEL_NAME, WAIT, serving, tinyctc_engine
from tests.vad import _audio

GAPS = [1.0, 1.5, 1.6, 1.4, 2.0]


@pytest.fixture(scope="module")
def sentences(clips):
    return _audio.join(clips[:4], GAPS, noise=0.0005, seed=3)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tmp_path_factory.mktemp("server_vad") / "ckpt"


@pytest.fixture(scope="module")
def server(ckpt):
    engine = tinyctc_engine(ckpt, max_batch_size=4)
    with serving(engine, api_key=API_KEY) as srv:
        yield srv


@pytest.fixture(scope="module")
def reference(ckpt, server):
    return tinyctc_engine(ckpt, max_batch_size=1)


def pcm16(audio: np.ndarray) -> np.ndarray:
    return np.clip(np.round(audio * 32768.0), -32768, 32767).astype(np.int16)


def b64_chunks(pcm: np.ndarray, step: int) -> list[str]:
    return [base64.b64encode(pcm[i:i + step].astype("<i2").tobytes()).decode() for i in range(0, len(pcm), step)]


async def _sdk_session(server, pcm: np.ndarray, turn_detection: dict) -> list[dict]:
    try:
        from openai import AsyncOpenAI
    except ImportError:
        pytest.fail("the openai SDK (with websockets) is not installed: pip install 'openai[realtime]'")
    client = AsyncOpenAI(api_key=API_KEY, base_url=f"{server.url}/v1", max_retries=0)
    events: list[dict] = []
    async with client.realtime.connect(model=MODEL_NAME) as conn:
        await conn.session.update(session={"type": "transcription", "audio": {"input": {
            "format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": turn_detection}}})
        for chunk in b64_chunks(pcm, 1600):
            await conn.input_audio_buffer.append(audio=chunk)
        completed = 0
        while completed < 4:
            event = await asyncio.wait_for(conn.recv(), WAIT)
            events.append(event.to_dict())
            if event.type == "error":
                raise AssertionError(event.to_dict())
            completed += event.type == "conversation.item.input_audio_transcription.completed"
    return events


@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")  # the SDK's to_dict of its own union types
def test_one_committed_transcript_per_sentence(server, reference, sentences):
    pcm = pcm16(sentences.audio)
    detection = {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300, "silence_duration_ms": 700}
    events = asyncio.run(asyncio.wait_for(_sdk_session(server, pcm, detection), 3 * WAIT))
    updated = next(e for e in events if e["type"] == "session.updated")
    assert updated["session"]["audio"]["input"]["turn_detection"] == detection
    started = [e for e in events if e["type"] == "input_audio_buffer.speech_started"]
    stopped = [e for e in events if e["type"] == "input_audio_buffer.speech_stopped"]
    committed = [e for e in events if e["type"] == "input_audio_buffer.committed"]
    completed = {e["item_id"]: e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed"}
    assert len(started) == len(stopped) == len(committed) == len(completed) == 4
    previous = None
    for i, (start, stop, commit) in enumerate(zip(started, stopped, committed, strict=True)):
        assert start["item_id"] == stop["item_id"] == commit["item_id"]
        assert commit["previous_item_id"] == previous
        previous = commit["item_id"]
        begin, end = start["audio_start_ms"] * 16, stop["audio_end_ms"] * 16
        s_begin, s_end = sentences.spans[i]
        assert begin <= s_begin + 8000 and end >= s_end - 1600, (i, begin, end, sentences.spans[i])
        assert end <= (sentences.spans[i + 1][0] if i + 1 < len(sentences.spans) else len(pcm))
        expected = reference.transcribe(pcm[begin:end].astype(np.float32) / 32768.0, sample_rate=16000)
        assert completed[commit["item_id"]]["transcript"] == expected
        assert expected
    order = [e["type"] for e in events if e["type"].startswith("input_audio_buffer.")]
    assert order == ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                     "input_audio_buffer.committed"] * 4
    metrics = __import__("httpx").get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {API_KEY}"}).text
    assert "oasr_realtime_turn_latency_seconds_count 4.0" in metrics


async def _ws_session(server, pcm24: np.ndarray) -> list[dict]:
    url = f"ws://127.0.0.1:{server.port}/v1/realtime"
    async with connect(url, additional_headers={"Authorization": f"Bearer {API_KEY}"}, open_timeout=WAIT) as ws:
        await ws.send(json.dumps({"type": "transcription_session.update",
                                  "session": {"input_audio_format": "pcm16", "turn_detection": {"type": "server_vad"}}}))
        for chunk in b64_chunks(pcm24, 4800):
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
        events = []
        while sum(e["type"].endswith("transcription.completed") for e in events) < 4:
            events.append(json.loads(await asyncio.wait_for(ws.recv(), WAIT)))
            assert events[-1]["type"] != "error", events[-1]
        return events


def test_server_vad_at_24khz_beta_shape(server, sentences):
    import soxr

    pcm24 = pcm16(soxr.resample(sentences.audio, 16000, 24000))
    events = asyncio.run(asyncio.wait_for(_ws_session(server, pcm24), 3 * WAIT))
    updated = next(e for e in events if e["type"] == "transcription_session.updated")
    assert updated["session"]["turn_detection"] == {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300,
                                                    "silence_duration_ms": 500}
    starts = [e["audio_start_ms"] for e in events if e["type"] == "input_audio_buffer.speech_started"]
    assert len(starts) == 4
    for ms, (begin, _) in zip(starts, sentences.spans, strict=True):
        assert abs(ms - begin / 16) < 500


def test_bad_turn_detection_is_refused(server):
    async def go():
        url = f"ws://127.0.0.1:{server.port}/v1/realtime"
        async with connect(url, additional_headers={"Authorization": f"Bearer {API_KEY}"}, open_timeout=WAIT) as ws:
            out = []
            for td in ({"type": "semantic_vad"}, {"type": "server_vad", "threshold": 2}, {"type": "server_vad", "x": 1}):
                await ws.send(json.dumps({"type": "session.update", "session": {
                    "type": "transcription", "audio": {"input": {"turn_detection": td}}}}))
                while True:
                    event = json.loads(await asyncio.wait_for(ws.recv(), WAIT))
                    if event["type"] == "error":
                        out.append(event["error"])
                        break
            return out

    errors = asyncio.run(asyncio.wait_for(go(), WAIT))
    assert [e["param"] for e in errors] == ["session.audio.input.turn_detection.type",
                                            "session.audio.input.turn_detection.threshold",
                                            "session.audio.input.turn_detection.x"]


def test_http_vad_filter(server, reference, sentences):
    import httpx

    from tests.serve.harness import wav_bytes

    audio = wav_bytes(pcm16(sentences.audio))
    response = httpx.post(f"{server.url}/v1/audio/transcriptions", headers={"Authorization": f"Bearer {API_KEY}"},
                          files={"file": ("speech.wav", audio, "audio/wav")},
                          data={"model": MODEL_NAME, "response_format": "verbose_json", "vad_filter": "true"},
                          timeout=WAIT)
    assert response.status_code == 200, response.text
    body = response.json()
    from oasr.engine import DecodingOptions

    expected = reference.transcribe_outputs(pcm16(sentences.audio).astype(np.float32) / 32768.0, sample_rate=16000,
                                            decoding=DecodingOptions(vad_filter=True))
    assert [(s["start"], s["end"]) for s in body["segments"]] == [(s.start, s.end) for s in expected.segments]
    assert body["text"] == expected.text and len(expected.segments) >= 2
    bad = httpx.post(f"{server.url}/v1/audio/transcriptions", headers={"Authorization": f"Bearer {API_KEY}"},
                     files={"file": ("speech.wav", audio, "audio/wav")}, data={"model": MODEL_NAME, "vad_filter": "maybe"},
                     timeout=WAIT)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "vad_filter"


def test_server_vad_on_a_streaming_engine_starts_each_turn_afresh(fixtures_dir, sentences):
    """Each turn is its own engine stream: its transcript equals the offline (chunk-4) transcription of
    that turn's audio alone, so nothing of the previous turn's stream state leaks into the next."""
    from oasr.engine import Engine, EngineConfig

    model = str(fixtures_dir / "wenet_u2pp" / "model")
    engine = Engine(EngineConfig(model=model, service_mode="streaming", chunk_size=4, max_streams=4))
    offline = Engine(EngineConfig(model=model, model_options={"decoding_chunk_size": 4}))
    pcm = pcm16(sentences.audio)

    async def go(server):
        url = f"ws://127.0.0.1:{server.port}/v1/realtime"
        async with connect(url, open_timeout=WAIT) as ws:
            await ws.send(json.dumps({"type": "session.update", "session": {"type": "transcription", "audio": {
                "input": {"format": {"type": "audio/pcm", "rate": 16000},
                          "turn_detection": {"type": "server_vad", "silence_duration_ms": 700}}}}}))
            for chunk in b64_chunks(pcm, 1600):
                await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
            events = []
            while sum(e["type"].endswith("transcription.completed") for e in events) < 4:
                events.append(json.loads(await asyncio.wait_for(ws.recv(), WAIT)))
                assert events[-1]["type"] != "error", events[-1]
            return events

    with serving(engine, served_model_names=(MODEL_NAME,)) as server:
        events = asyncio.run(asyncio.wait_for(go(server), 3 * WAIT))
    starts = {e["item_id"]: e["audio_start_ms"] for e in events if e["type"] == "input_audio_buffer.speech_started"}
    stops = {e["item_id"]: e["audio_end_ms"] for e in events if e["type"] == "input_audio_buffer.speech_stopped"}
    done = [e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed"]
    assert len(done) == 4 and any(e["type"].endswith("transcription.delta") for e in events)
    for event in done:
        turn = pcm[starts[event["item_id"]] * 16: stops[event["item_id"]] * 16].astype(np.float32) / 32768.0
        assert event["transcript"] == offline.transcribe(turn, sample_rate=16000)
        assert event["transcript"]
