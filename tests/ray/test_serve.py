"""``oasr serve`` on Ray Serve answers the official openai SDK exactly like in-process ``oasr serve``:
JSON, verbose_json, server-sent events and the realtime WebSocket."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import time

import httpx
import numpy as np
import pytest
import soundfile as sf

from oasr.engine import Engine, EngineConfig
from oasr.serve.settings import ServerSettings
from tests.serve.harness import WAIT, serving

NAME = "wenet-test"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def ray_serve(ray_cluster, wenet_model):
    from ray import serve

    from oasr.ray.serve import start

    port = _free_port()
    start(EngineConfig(model=str(wenet_model)), ServerSettings(served_model_names=(NAME,)), port=port, replicas=1)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(url + "/ready", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "the Ray Serve deployment never became ready"
        time.sleep(0.5)
    try:
        yield url
    finally:
        serve.shutdown()


@pytest.fixture(scope="module")
def local(wenet_model):
    with serving(Engine(EngineConfig(model=str(wenet_model))), served_model_names=(NAME,)) as server:
        yield server.url


@pytest.fixture(scope="module")
def speech(fixtures_dir) -> bytes:
    return (fixtures_dir / "audio" / "clip1.wav").read_bytes()


def _client(url):
    import openai

    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=WAIT)


@pytest.mark.parametrize("fmt", ["json", "verbose_json", "text", "srt"])
def test_transcriptions_equal_in_process_serve(ray_serve, local, speech, fmt):
    def ask(url):
        result = _client(url).audio.transcriptions.create(model=NAME, file=("clip1.wav", speech), response_format=fmt)
        return result if isinstance(result, str) else result.model_dump()

    ours, theirs = ask(ray_serve), ask(local)
    assert ours == theirs
    assert (ours if isinstance(ours, str) else ours["text"]).strip()


def test_server_sent_events_equal_in_process_serve(ray_serve, local, speech):
    def events(url):
        stream = _client(url).audio.transcriptions.create(model=NAME, file=("clip1.wav", speech), stream=True)
        return [event.model_dump() for event in stream]

    ours = events(ray_serve)
    assert ours == events(local) and ours[-1]["type"] == "transcript.text.done"


def test_realtime_websocket_equals_in_process_serve(ray_serve, local, fixtures_dir):
    from websockets.asyncio.client import connect

    pcm, rate = sf.read(fixtures_dir / "audio" / "clip1.wav", dtype="int16")
    pieces = [base64.b64encode(pcm[i:i + 1600].astype("<i2").tobytes()).decode() for i in range(0, len(pcm), 1600)]

    async def transcript(url):
        async with connect(url.replace("http", "ws") + "/v1/realtime", open_timeout=WAIT) as ws:
            async def recv():
                return json.loads(await asyncio.wait_for(ws.recv(), WAIT))

            assert (await recv())["type"] == "session.created"
            await ws.send(json.dumps({"type": "session.update", "session": {"type": "transcription", "audio": {
                "input": {"format": {"type": "audio/pcm", "rate": rate}, "transcription": {"model": NAME},
                          "turn_detection": None}}}}))
            assert (await recv())["type"] == "session.updated"
            for piece in pieces:
                await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": piece}))
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            for _ in range(1000):
                event = await recv()
                if event["type"] == "conversation.item.input_audio_transcription.completed":
                    return event["transcript"]
            raise AssertionError("no completed transcript")

    ours = asyncio.run(transcript(ray_serve))
    assert ours == asyncio.run(transcript(local)) and ours.strip()
    assert np.asarray(pcm).size > 0


def test_the_serve_run_application_builder_reads_oasr_serve_flags(ray_cluster, wenet_model):
    from oasr.ray.serve import app_builder

    app = app_builder({"model": str(wenet_model), "replicas": 2, "replica_cpus": 0.5, "max_batch_size": 4})
    deployment = app._bound_deployment  # Ray 2.60's Application keeps its deployment here
    assert deployment.num_replicas == 2 and deployment.ray_actor_options["num_cpus"] == 0.5
    from oasr.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown oasr serve option.*--no-such-flag"):
        app_builder({"model": str(wenet_model), "no_such_flag": 1})
