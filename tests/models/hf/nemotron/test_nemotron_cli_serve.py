"""Nemotron ASR through the user-facing surfaces: ``oasr transcribe`` (auto-detected, per-request ``--language``
on 3.5) against transformers' ``generate()``, and ``oasr serve --streaming`` (HTTP upload and the realtime
WebSocket) on a streaming Nemotron directory against the in-process streaming engine, whose text equals offline."""

from __future__ import annotations

import json

import openai
import pytest
import soundfile as sf

from oasr.cli import main
from oasr.engine import DecodingOptions, Engine, EngineConfig
from tests.models.hf.nemotron.conftest import load_hf
from tests.models.hf.nemotron.test_nemotron_offline import _generate
from tests.serve.harness import WAIT, check_realtime_transcripts, oasr_serve_process, serving, wav_bytes

pytestmark = pytest.mark.reference
STREAM_FLAGS = ("--chunk-size", "4", "--max-streams", "4")


@pytest.fixture(scope="module")
def wavs(speech, tmp_path_factory):
    root = tmp_path_factory.mktemp("nemotron_wavs")
    paths = []
    for i in (0, 3):
        sf.write(root / f"clip{i}.wav", speech[i], 16000, subtype="PCM_16")
        paths.append(root / f"clip{i}.wav")
    return paths


@pytest.mark.parametrize(("checkpoint", "language"), [("stream_dir", None), ("v35_dir", None), ("v35_dir", "zh")])
def test_oasr_transcribe_gives_transformers_ids(request, checkpoint, wavs, language, capsys):
    any_dir = request.getfixturevalue(checkpoint)
    hf, processor = load_hf(any_dir)
    is_v35 = hf.config.model_type == "nemotron3_5_asr"
    for wav in wavs:
        extra = ["--language", language] if language else []
        code = main(["transcribe", str(wav), "--model", str(any_dir), "-f", "verbose_json", "--no-progress", *extra])
        captured = capsys.readouterr()
        assert code == 0, captured.err
        result = json.loads(captured.out)
        audio, _ = sf.read(wav, dtype="float32")
        hf_language = {None: "auto", "zh": "zh-ZH"}[language] if is_v35 else None
        ids, text = _generate(hf, processor, audio, language=hf_language)
        assert [t for s in result["segments"] for t in s["tokens"]] == ids and ids
        assert result["text"].strip() == text.strip()


def test_oasr_serve_answers_each_request_in_its_language(v35_dir, speech):
    engine = Engine(EngineConfig(model=str(v35_dir)))
    audio = wav_bytes((speech[0] * 32767).astype("int16"))
    expected = {lang: engine.transcribe_outputs(audio, decoding=DecodingOptions(language=lang)).text
                for lang in ("en", "zh")}
    assert expected["en"] != expected["zh"]
    with serving(engine, served_model_names=("nemotron",)) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=WAIT)
        for lang, text in expected.items():
            got = client.audio.transcriptions.create(file=("clip.wav", audio), model="nemotron", language=lang)
            assert got.text == text


# -- `oasr serve --streaming` on a streaming Nemotron directory ----------------------------------------------------
@pytest.fixture(scope="module")
def streaming_reference(stream_dir, wavs) -> dict[str, str]:
    """The in-process streaming engine's transcripts (equal to offline, tested in test_nemotron_streaming)."""
    engine = Engine(EngineConfig(model=str(stream_dir), service_mode="streaming", chunk_size=4, max_streams=2))
    offline = Engine(EngineConfig(model=str(stream_dir)))
    texts = {}
    for wav in wavs:
        out = engine.transcribe_outputs(wav.read_bytes())
        assert out.text and out.tokens == offline.transcribe_outputs(wav.read_bytes()).tokens
        texts[wav.name] = out.text
    return texts


@pytest.fixture(scope="module")
def serve_process(stream_dir):
    with oasr_serve_process(["--model", str(stream_dir), "--streaming", *STREAM_FLAGS, "--served-model-name",
                             "nemotron", "--no-access-log", "--log-level", "warning", "--threads", "1"]) as served:
        yield served.port
    assert "streaming) on http://127.0.0.1:" in served.stderr


def test_oasr_serve_streaming_http_upload(serve_process, wavs, streaming_reference):
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{serve_process}/v1", api_key="none", max_retries=0,
                           timeout=WAIT)
    assert [m.id for m in client.models.list()] == ["nemotron"]
    for wav in wavs:
        text = client.audio.transcriptions.create(file=(wav.name, wav.read_bytes()), model="nemotron").text
        assert text == streaming_reference[wav.name] and text


def test_oasr_serve_realtime_websocket_streams_the_engines_hypotheses(serve_process, wavs, streaming_reference):
    audio = {wav.name: sf.read(wav, dtype="int16")[0] for wav in wavs}
    check_realtime_transcripts(serve_process, audio, streaming_reference)
