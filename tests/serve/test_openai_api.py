"""The HTTP API driven by the official ``openai`` client against a real server on 127.0.0.1.

Expected transcripts come from a second, in-process engine on the same checkpoint: the server must
return exactly what the engine produces, in every response format.
"""

from __future__ import annotations

import threading

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from oasr.engine import DecodingOptions
from oasr.engine.formats import render
from tests.serve.harness import API_KEY, MODEL_NAME, WAIT, gated, wait_until

DURATION = 3.0


def client_for(server, *, api_key: str = API_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=api_key, max_retries=0, timeout=WAIT)


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return client_for(server)


@pytest.fixture(scope="module")
def expected(reference, speech):
    return reference.transcribe_outputs(speech)


@pytest.fixture(scope="module")
def expected_words(reference, speech):
    return reference.transcribe_outputs(speech, decoding=DecodingOptions(word_timestamps=True))


def transcribe(client, audio: bytes, **kwargs):
    return client.audio.transcriptions.create(file=("speech.wav", audio), model=MODEL_NAME, **kwargs)


def metric(server, name: str, **labels) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=WAIT).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


def test_the_text_is_nonempty_so_comparisons_mean_something(expected):
    assert expected.finish_reason == "stop" and len(expected.text) > 5


def test_models_list_and_retrieve(client):
    assert [m.id for m in client.models.list()] == [MODEL_NAME]
    assert client.models.retrieve(MODEL_NAME).id == MODEL_NAME
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("whisper-1")
    assert info.value.body["code"] == "model_not_found"


def test_json(client, speech, expected):
    result = transcribe(client, speech)
    assert result.text == expected.text


def test_text(client, speech, expected):
    result = transcribe(client, speech, response_format="text")
    assert isinstance(result, str) and result == expected.text.strip() + "\n"


@pytest.mark.parametrize("fmt", ["srt", "vtt"])
def test_subtitles(client, speech, expected, fmt):
    result = transcribe(client, speech, response_format=fmt)
    assert result == render(expected, fmt)
    stamp = "00:00:00,000 --> 00:00:03,000" if fmt == "srt" else "00:00:00.000 --> 00:00:03.000"
    assert stamp in result and expected.text.strip() in result
    assert result.startswith("WEBVTT") == (fmt == "vtt")


def test_verbose_json_has_openai_schema(client, speech, expected):
    result = transcribe(client, speech, response_format="verbose_json")
    assert type(result).__name__ == "TranscriptionVerbose"
    assert result.text == expected.text and result.duration == pytest.approx(DURATION)
    assert result.words is None
    assert len(result.segments) == 1
    segment = result.segments[0]
    assert (segment.id, segment.start, segment.end, segment.text) == (0, 0.0, pytest.approx(DURATION), expected.text)
    assert segment.tokens == expected.tokens


def test_word_granularity(client, speech, expected_words):
    result = transcribe(client, speech, response_format="verbose_json", timestamp_granularities=["word"])
    want = [(w.word, round(w.start, 3), round(w.end, 3)) for w in expected_words.words]
    assert want, "the reference produced no words"
    assert [(w.word, w.start, w.end) for w in result.words] == want
    assert result.segments is None  # only the asked granularity
    starts = [w.start for w in result.words]
    assert starts == sorted(starts) and 0.0 <= starts[0] and result.words[-1].end <= DURATION + 1e-6


def test_word_and_segment_granularities(client, speech, expected_words):
    result = transcribe(client, speech, response_format="verbose_json", timestamp_granularities=["word", "segment"])
    assert len(result.words) == len(expected_words.words) and len(result.segments) == 1
    assert result.segments[0].text == expected_words.text


def test_stream_events_parsed_by_the_sdk(client, speech, expected):
    events = list(transcribe(client, speech, stream=True))
    types = [e.type for e in events]
    assert types[-1] == "transcript.text.done" and types.count("transcript.text.done") == 1
    assert set(types[:-1]) == {"transcript.text.delta"}
    assert "".join(e.delta for e in events[:-1]) == events[-1].text == expected.text


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the SDK marks translations deprecated
def test_translation_is_refused_by_a_model_that_cannot_translate(client, speech):
    with pytest.raises(openai.BadRequestError) as info:
        client.audio.translations.create(file=("speech.wav", speech), model=MODEL_NAME)
    assert info.value.status_code == 400 and info.value.body["param"] == "task"
    assert "task" in info.value.body["message"]


def test_concurrent_requests_share_a_batch(server, client, speech, expected):
    """Requests that arrive while a batch runs are decoded together in the next one."""
    engine = server.state.engine
    results: list = []
    with gated(engine) as gate:
        threads = [threading.Thread(target=lambda: results.append(transcribe(client, speech).text)) for _ in range(4)]
        threads[0].start()
        wait_until(lambda: server.state.in_flight == 1 and engine.metrics_snapshot()["queue_depth"] == 0,
                   "the first request to be running")
        for t in threads[1:]:
            t.start()
        wait_until(lambda: engine.metrics_snapshot()["queue_depth"] == 3, "three requests queued behind it")
        batches = engine.metrics.batches
        gate.set()
        for t in threads:
            t.join(WAIT)
    assert results == [expected.text] * 4
    # the running request finished alone, the three queued behind it ran as one batch
    assert engine.metrics.batches - batches == 2 and engine.metrics.max_batch_size >= 3
    assert metric(server, "oasr_batch_size_bucket", le="4.0") - metric(server, "oasr_batch_size_bucket", le="2.0") >= 1


def test_saturation_answers_429_and_recovers(server, client, speech, expected):
    engine = server.state.engine
    results: list = []
    with gated(engine) as gate:
        threads = [threading.Thread(target=lambda: results.append(transcribe(client, speech).text)) for _ in range(4)]
        for t in threads:
            t.start()
        wait_until(lambda: server.state.in_flight == 4, "four requests in flight")
        with pytest.raises(openai.RateLimitError) as info:
            transcribe(client, speech)
        assert info.value.body["code"] == "rate_limit_exceeded" and "concurrency limit" in info.value.body["message"]
        assert info.value.response.headers["retry-after"] == "1"
        gate.set()
        for t in threads:
            t.join(WAIT)
    assert results == [expected.text] * 4
    assert transcribe(client, speech).text == expected.text


def test_a_client_that_disconnects_frees_its_request(server, speech):
    engine = server.state.engine
    aborted = engine.metrics.finished["abort"]
    disconnected = metric(server, "oasr_requests_total", endpoint="transcriptions", outcome="disconnected")
    with gated(engine):
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{server.url}/v1/audio/transcriptions", headers={"Authorization": f"Bearer {API_KEY}"},
                       files={"file": ("a.wav", speech)}, data={"model": MODEL_NAME}, timeout=0.5)
        wait_until(lambda: server.state.in_flight == 0, "the request to be freed")
        assert engine.metrics.finished["abort"] == aborted + 1
        assert not server.state.runner.in_flight
    assert metric(server, "oasr_requests_total", endpoint="transcriptions", outcome="disconnected") == disconnected + 1


def test_a_stream_whose_client_disconnects_is_freed(server, speech):
    engine = server.state.engine
    aborted = engine.metrics.finished["abort"]
    with gated(engine):
        with httpx.stream("POST", f"{server.url}/v1/audio/transcriptions",
                          headers={"Authorization": f"Bearer {API_KEY}"}, files={"file": ("a.wav", speech)},
                          data={"model": MODEL_NAME, "stream": "true"}, timeout=WAIT) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
        wait_until(lambda: server.state.in_flight == 0, "the stream to be freed")
        assert engine.metrics.finished["abort"] == aborted + 1


def test_api_key(server, speech, expected):
    with pytest.raises(openai.AuthenticationError) as info:
        transcribe(client_for(server, api_key="wrong"), speech)
    assert info.value.body == {"message": "incorrect API key provided", "type": "invalid_request_error",
                               "param": None, "code": "invalid_api_key"}
    response = httpx.post(f"{server.url}/v1/audio/transcriptions", files={"file": ("a.wav", speech)}, timeout=WAIT)
    assert response.status_code == 401 and "no API key provided" in response.json()["error"]["message"]
    assert httpx.get(f"{server.url}/v1/models", timeout=WAIT).status_code == 401
    assert httpx.get(f"{server.url}/health", timeout=WAIT).status_code == 200  # probes stay open


def test_health_ready_metrics(server, client, speech):
    assert httpx.get(f"{server.url}/health", timeout=WAIT).json() == {"status": "ok"}
    ready = httpx.get(f"{server.url}/ready", timeout=WAIT)
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    before = metric(server, "oasr_requests_total", endpoint="transcriptions", outcome="success")
    audio_before = metric(server, "oasr_audio_seconds_total", endpoint="transcriptions")
    transcribe(client, speech)
    assert metric(server, "oasr_requests_total", endpoint="transcriptions", outcome="success") == before + 1
    assert metric(server, "oasr_audio_seconds_total", endpoint="transcriptions") == pytest.approx(audio_before + 3.0)
    assert metric(server, "oasr_request_latency_seconds_count", endpoint="transcriptions") >= 1
    assert metric(server, "oasr_in_flight_requests") == 0
    text = httpx.get(f"{server.url}/metrics", timeout=WAIT).text
    for name in ("oasr_engine_queue_depth", "oasr_engine_streams", "oasr_batch_size_bucket",
                 "oasr_realtime_sessions", "oasr_engine_batches_total"):
        assert name in text


def test_unknown_route_has_openai_error_shape(server):
    response = httpx.get(f"{server.url}/v1/nope", timeout=WAIT)
    assert response.status_code == 404
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}
