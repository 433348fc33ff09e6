"""A FunASR Paraformer through the user-facing surfaces: ``oasr transcribe -f verbose_json`` and
``oasr serve`` (the OpenAI-compatible API, through the server test harness)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import openai
import pytest

import oasr
from oasr.engine import DecodingOptions
from tests.models.funasr import _helpers as h
from tests.serve.harness import WAIT, serving, wav_bytes

NAME = "paraformer-test"


@pytest.fixture(scope="module")
def bicif_dir(model_dirs):
    return model_dirs[("BiCifParaformer", "small")]


def test_transcribe_cli_verbose_json_has_word_times(bicif_dir):
    expected = oasr.Engine(oasr.EngineConfig(model=str(bicif_dir))).transcribe_outputs(
        str(h.SAMPLE), decoding=DecodingOptions(word_timestamps=True))
    done = subprocess.run([sys.executable, "-m", "oasr.cli", "transcribe", str(h.SAMPLE), "--model", str(bicif_dir),
                           "-f", "verbose_json", "--word-timestamps"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["text"] == expected.text
    assert [(w["word"], w["start"], w["end"]) for w in result["words"]] == [
        (w.word, round(w.start, 3), round(w.end, 3)) for w in expected.words]
    assert len(result["words"]) > 10 and all(w["start"] <= w["end"] for w in result["words"])


def test_serve_answers_with_funasr_transcripts(bicif_dir, clips):
    engine = oasr.Engine(oasr.EngineConfig(model=str(bicif_dir)))
    # espeak's samples are exact 16-bit values: the upload carries the very samples decoded in-process
    # (digital silence makes a random model's log-mel features sensitive to a single LSB)
    audio = clips[0][1]
    payload = wav_bytes(np.clip(np.round(audio * 32768), -32768, 32767).astype(np.int16))
    expected = engine.transcribe_outputs(payload, decoding=DecodingOptions(word_timestamps=True))
    with serving(engine, served_model_names=(NAME,)) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=WAIT)
        plain = client.audio.transcriptions.create(file=("a.wav", payload), model=NAME)
        timed = client.audio.transcriptions.create(file=("a.wav", payload), model=NAME, response_format="verbose_json",
                                                   timestamp_granularities=["word"])
    assert plain.text == expected.text and expected.text
    assert [(w.word, w.start, w.end) for w in timed.words] == [
        (w.word, round(w.start, 3), round(w.end, 3)) for w in expected.words]
