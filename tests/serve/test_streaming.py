"""The server on the streaming engine (WeNet U2++ fixture, chunk 4): realtime deltas while audio is
still arriving, and partial results on ``stream=true`` uploads.

The expected transcript is offline transcription of the same audio with WeNet's
``decoding_chunk_size`` (the chunk attention mask the model streams with); the in-process streaming
engine must agree with it too, so how the audio was cut into appends cannot change the result.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import openai
import pytest
import soundfile as sf
from websockets.asyncio.client import connect

from oasr.engine import Engine, EngineConfig
from tests.serve.harness import SAMPLE, WAIT, serving, wav_bytes
from tests.serve.test_realtime import Session, chunks, run

NAME = "u2pp"


def _streaming_config(fixtures_dir) -> EngineConfig:
    return EngineConfig(model=str(fixtures_dir / "wenet_u2pp" / "model"), service_mode="streaming", chunk_size=4,
                        max_streams=4)


@pytest.fixture(scope="module")
def pcm() -> np.ndarray:
    samples, rate = sf.read(SAMPLE, dtype="int16")
    return samples[: 3 * rate]


@pytest.fixture(scope="module")
def expected(fixtures_dir, pcm) -> str:
    audio = pcm.astype(np.float32) / 32768.0
    offline = Engine(EngineConfig(model=str(fixtures_dir / "wenet_u2pp" / "model"),
                                  model_options={"decoding_chunk_size": 4}))
    text = offline.transcribe(audio, sample_rate=16000)
    assert Engine(_streaming_config(fixtures_dir)).transcribe(audio, sample_rate=16000) == text
    assert len(text) > 3
    return text


@pytest.fixture(scope="module")
def streaming_server(fixtures_dir):
    with serving(Engine(_streaming_config(fixtures_dir)), served_model_names=(NAME,)) as server:
        yield server


def test_realtime_deltas_arrive_while_audio_is_streaming(streaming_server, pcm, expected):
    async def scenario():
        async with connect(f"ws://127.0.0.1:{streaming_server.port}/v1/realtime", open_timeout=WAIT) as ws:
            s = Session(ws)
            await s.recv()
            await s.send("session.update", session={"type": "transcription", "audio": {"input": {
                "format": {"type": "audio/pcm", "rate": 16000}}}})
            assert (await s.recv())["type"] == "session.updated"
            early: list[dict] = []
            for chunk in chunks(pcm, 16000, 0.1):
                await s.send("input_audio_buffer.append", audio=chunk)
            # before committing (the end of the stream), partial results must already be coming
            for _ in range(1000):
                early.append(await s.recv())
                if early[-1]["type"].endswith(".delta"):
                    break
            await s.send("input_audio_buffer.commit")
            return early, await s.until("conversation.item.input_audio_transcription.completed")

    early, late = run(scenario())
    assert early[-1]["type"] == "conversation.item.input_audio_transcription.delta"
    committed = next(e for e in late if e["type"] == "input_audio_buffer.committed")
    deltas = [e for e in early + late if e["type"].endswith(".delta")]
    assert {e["item_id"] for e in deltas} == {committed["item_id"]} == {late[-1]["item_id"]}
    assert late[-1]["transcript"] == expected
    assert "".join(e["delta"] for e in deltas) == expected  # greedy CTC partials only append


def test_upload_streams_partials_over_sse(streaming_server, pcm, expected):
    client = openai.OpenAI(base_url=f"{streaming_server.url}/v1", api_key="none", max_retries=0, timeout=WAIT)
    audio = wav_bytes(pcm)
    events = list(client.audio.transcriptions.create(file=("a.wav", audio), model=NAME, stream=True))
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    assert events[-1].type == "transcript.text.done" and events[-1].text == expected
    assert len(deltas) >= 2 and "".join(deltas) == expected
    assert client.audio.transcriptions.create(file=("a.wav", audio), model=NAME).text == expected


def test_concurrent_realtime_sessions_are_independent(streaming_server, pcm, expected):
    async def one(audio):
        async with connect(f"ws://127.0.0.1:{streaming_server.port}/v1/realtime", open_timeout=WAIT) as ws:
            s = Session(ws)
            await s.recv()
            await s.send("session.update", session={"type": "transcription", "audio": {"input": {
                "format": {"type": "audio/pcm", "rate": 16000}}}})
            await s.recv()
            for chunk in chunks(audio, 16000, 0.2):
                await s.send("input_audio_buffer.append", audio=chunk)
            await s.send("input_audio_buffer.commit")
            return (await s.until("conversation.item.input_audio_transcription.completed"))[-1]["transcript"]

    async def both():
        return await asyncio.gather(one(pcm), one(pcm), one(pcm))

    assert run(both()) == [expected] * 3
    metrics = json.dumps(streaming_server.state.engine.metrics_snapshot())
    assert streaming_server.state.in_flight == 0, metrics
