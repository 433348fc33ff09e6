"""The API on Whisper: the trained tiny.en on real speech (timed segments, words, streaming, options),
and translations on a tiny random multilingual checkpoint built offline by transformers.

Expected outputs come from the same engine, in-process, before the server starts.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import openai
import pytest
import soundfile as sf

from oasr.engine import DecodingOptions, Engine, EngineConfig
from oasr.engine.formats import render
from tests.serve.harness import WAIT, serving, wav_bytes

NAME = "whisper-tiny.en"
SECONDS = 6


@pytest.fixture(scope="module")
def beckett() -> bytes:
    import moonshine_onnx

    path = Path(moonshine_onnx.__file__).parent / "assets" / "beckett.wav"
    samples, rate = sf.read(path, dtype="int16")
    return wav_bytes(samples[: SECONDS * rate], rate)


@pytest.fixture(scope="module")
def whisper(beckett):
    """(server, expected outputs): tiny.en served, after the references were computed in-process."""
    engine = Engine(EngineConfig(model=NAME))
    expected = {
        "plain": engine.transcribe_outputs(beckett),
        "timed": engine.transcribe_outputs(beckett, decoding=DecodingOptions(timestamps=True)),
        "words": engine.transcribe_outputs(beckett, decoding=DecodingOptions(timestamps=True, word_timestamps=True)),
        "prompted": engine.transcribe_outputs(beckett, decoding=DecodingOptions(language="en", prompt="Beckett.")),
        "batched": engine.transcribe_outputs(beckett, decoding=DecodingOptions(batched=True)),
    }
    with serving(engine, served_model_names=(NAME,)) as server:
        yield openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=WAIT), expected


def create(client, audio, **kwargs):
    return client.audio.transcriptions.create(file=("beckett.wav", audio), model=NAME, **kwargs)


def test_real_speech(whisper, beckett):
    client, expected = whisper
    assert "ever failed" in expected["plain"].text.lower()
    assert create(client, beckett).text == expected["plain"].text


def test_batched_form_field_selects_batched_long_form(whisper, beckett):
    """``batched=true`` (an extension field, like ``vad_filter``) decodes as DecodingOptions(batched=True):
    VAD chunks without previous-text conditioning, so the segments are the batched pipeline's."""
    client, expected = whisper
    want = expected["batched"]
    result = create(client, beckett, response_format="verbose_json", extra_body={"batched": "true"})
    assert result.text == want.text
    assert [(s.start, s.end) for s in result.segments] == [(s.start, s.end) for s in want.segments]
    assert [(s.start, s.end) for s in want.segments] != [(s.start, s.end) for s in expected["timed"].segments] or \
        want.silences  # the batched plan differs from the sequential one: speech chunks, silences reported


def test_verbose_json_with_words_and_segments(whisper, beckett):
    client, expected = whisper
    want = expected["words"]
    result = create(client, beckett, response_format="verbose_json", timestamp_granularities=["word", "segment"])
    assert result.text == want.text and result.language == want.language == "en"
    assert result.duration == pytest.approx(SECONDS)
    assert [(s.start, s.end, s.text) for s in result.segments] == [
        (round(s.start, 3), round(s.end, 3), s.text) for s in want.segments]
    assert len(result.segments) >= 2
    assert [(w.word, w.start, w.end) for w in result.words] == [
        (w.word, round(w.start, 3), round(w.end, 3)) for w in want.words]
    assert all(w.start <= w.end for w in result.words)
    assert result.segments[0].avg_logprob == pytest.approx(want.segments[0].avg_logprob)


def test_srt_has_one_cue_per_segment(whisper, beckett):
    client, expected = whisper
    result = create(client, beckett, response_format="srt")
    assert result == render(expected["timed"], "srt")
    assert result.count(" --> ") == len(expected["timed"].segments) >= 2


def test_stream_sends_a_delta_per_segment(whisper, beckett):
    client, expected = whisper
    events = list(create(client, beckett, stream=True))
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    assert events[-1].type == "transcript.text.done" and events[-1].text == expected["plain"].text
    assert "".join(deltas) == expected["plain"].text and len(deltas) == len(expected["plain"].segments)


def test_language_and_prompt_reach_the_model(whisper, beckett):
    client, expected = whisper
    assert create(client, beckett, language="en", prompt="Beckett.").text == expected["prompted"].text
    with pytest.raises(openai.BadRequestError) as info:
        create(client, beckett, language="fr")
    assert info.value.body["param"] == "language"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_an_english_only_model_refuses_to_translate(whisper, beckett):
    client, _ = whisper
    with pytest.raises(openai.BadRequestError) as info:
        client.audio.translations.create(file=("beckett.wav", beckett), model=NAME)
    assert info.value.body["param"] == "task" and "English-only" in info.value.body["message"]


@pytest.fixture(scope="module")
def multilingual_dir(tmp_path_factory) -> Path:
    from transformers import WhisperTokenizerFast

    from tests.models.hf.whisper import _helpers as h

    tokenizer_dir = tmp_path_factory.mktemp("ml_tokenizer")
    WhisperTokenizerFast(tokenizer_object=h.whisper_tokenizer(multilingual=True), bos_token="<|endoftext|>",
                         eos_token="<|endoftext|>", unk_token="<|endoftext|>",
                         pad_token="<|endoftext|>").save_pretrained(tokenizer_dir)
    return h.build_tiny_hf(tmp_path_factory.mktemp("ml_whisper"), tokenizer_dir, seed=3)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_translations_on_a_multilingual_checkpoint(multilingual_dir):
    from tests.models.hf.whisper import _helpers as h

    audio = wav_bytes(np.round(h.chirp_audio(2.0, 180.0, 1) * 32767).astype(np.int16))
    engine = Engine(EngineConfig(model=str(multilingual_dir)))
    translate = DecodingOptions(task="translate", language="de")
    want = engine.transcribe_outputs(audio, decoding=translate)
    assert want.finish_reason in ("stop", "length"), want.error
    with serving(engine, served_model_names=("ml",)) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=WAIT)
        result = client.audio.translations.create(file=("a.wav", audio), model="ml", extra_body={"language": "de"})
    assert result.text == want.text
