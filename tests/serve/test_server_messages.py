"""What a newcomer reads from the server: the 415 body names the upload, ``model=whisper-1`` (OpenAI's own
examples) is served through ``--served-model-name`` and the 404 says so, JSON transcriptions carry OpenAI's
``usage``, and verbose_json's ``seek`` is the window start openai-whisper reports, with no segment past the
end of the audio."""

from __future__ import annotations

import numpy as np
import openai
import pytest

from oasr.cli import build_parser
from oasr.engine import Engine, EngineConfig
from tests.serve.harness import API_KEY, MODEL_NAME, serving, wav_bytes

DURATION = 3.0


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0)


def test_the_415_body_names_the_uploaded_file(client):
    with pytest.raises(openai.APIStatusError) as info:
        client.audio.transcriptions.create(model=MODEL_NAME, file=("lecture.mp3", b"\0not audio" * 80))
    assert info.value.status_code == 415
    message = info.value.body["message"]
    assert "uploaded file 'lecture.mp3': could not decode audio <800 bytes>" in message, message
    assert "Error opening the input" in message, message
    for leaked in ("BytesIO", " object at 0x", "<none>"):
        assert leaked not in message, message


def test_an_unknown_model_404_names_the_alias_flag(client, speech):
    with pytest.raises(openai.NotFoundError) as info:
        client.audio.transcriptions.create(model="whisper-1", file=("a.wav", speech))
    message = info.value.body["message"]
    assert "'whisper-1' does not exist on this server; it serves: tinyctc-test" in message
    assert f"--served-model-name {MODEL_NAME} whisper-1" in message


def test_served_model_name_takes_several_names_as_vllm(ckpt_dir):
    parser = build_parser()
    several = parser.parse_args(["serve", "--served-model-name", "tiny.en", "whisper-1"])
    repeated = parser.parse_args(["serve", "--served-model-name", "tiny.en", "--served-model-name", "whisper-1"])
    assert several.served_model_name == repeated.served_model_name == ["tiny.en", "whisper-1"]
    assert parser.parse_args(["serve"]).served_model_name is None


def test_whisper_1_is_served_under_an_alias(ckpt_dir, speech, reference):
    from tests.serve.harness import tinyctc_engine

    engine = tinyctc_engine(ckpt_dir, max_batch_size=2)
    with serving(engine, served_model_names=(MODEL_NAME, "whisper-1")) as server:
        aliased = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        assert [m.id for m in aliased.models.list()] == [MODEL_NAME, "whisper-1"]
        result = aliased.audio.transcriptions.create(model="whisper-1", file=("a.wav", speech))
    assert result.text == reference.transcribe(speech)


def test_json_transcriptions_carry_duration_usage(client, speech):
    plain = client.audio.transcriptions.create(model=MODEL_NAME, file=("a.wav", speech))
    assert plain.usage is not None and plain.usage.type == "duration"
    assert plain.usage.seconds == pytest.approx(DURATION)
    verbose = client.audio.transcriptions.create(model=MODEL_NAME, file=("a.wav", speech),
                                                 response_format="verbose_json")
    assert verbose.usage is not None and verbose.usage.type == "duration"
    assert verbose.usage.seconds == pytest.approx(DURATION) == verbose.duration


@pytest.fixture(scope="module")
def long_recording(tmp_path_factory) -> np.ndarray:
    """Over two Whisper windows of espeak speech with pauses, ending mid-window."""
    from tests.models.hf.whisper import _helpers as h

    work = tmp_path_factory.mktemp("speech")
    parts = [h.espeak(text, work / f"{i}.wav") for i, text in enumerate(h.ESPEAK_SENTENCES)]
    pause = np.zeros(8000, np.float32)
    audio = np.concatenate([x for _ in range(4) for p in parts for x in (p, pause)])
    assert 60 < len(audio) / h.SAMPLE_RATE < 90
    return audio


def test_verbose_json_seek_is_openai_whispers_window_start(long_recording):
    import whisper

    from tests.models.hf.whisper import _helpers as h

    engine = Engine(EngineConfig())
    duration = len(long_recording) / h.SAMPLE_RATE
    with serving(engine, served_model_names=("tiny.en",)) as server:
        api = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        ours = api.audio.transcriptions.create(model="tiny.en", file=("long.wav", wav_bytes(long_recording)),
                                               response_format="verbose_json")
    model = h.openai_model(engine.model.config, engine.model.state_dict())
    ref = whisper.transcribe(model, long_recording, fp16=False)
    want = [(s["seek"], round(s["start"], 2), round(min(s["end"], duration), 2), s["text"].strip())
            for s in ref["segments"]]
    got = [(s.seek, round(s.start, 2), round(s.end, 2), s.text.strip()) for s in ours.segments]
    assert got == want
    assert len({s.seek for s in ours.segments}) >= 3  # several windows, each named by its own start
    assert all(s.end <= ours.duration for s in ours.segments)


def test_no_segment_or_word_ends_after_the_audio():
    from oasr.decoding.types import Segment, WordTiming
    from oasr.engine.formats import segments_of, words_of
    from oasr.engine.options import RequestOutput

    words = [WordTiming(" last", 9.5, 10.62)]
    segment = Segment(0, 8.0, 10.62, " last", [1, 2], words=words, seek=300)
    output = RequestOutput("r", text=" last", segments=[segment], duration=10.2)
    (shown,) = segments_of(output)
    assert (shown["seek"], shown["start"], shown["end"]) == (300, 8.0, 10.2)
    assert words_of(output) == [{"word": " last", "start": 9.5, "end": 10.2}]
