"""``oasr transcribe`` and ``oasr serve`` run Parakeet CTC: the CLI's JSON and the server's answer equal the engine's."""

from __future__ import annotations

import json

import openai
import soundfile as sf

from oasr.cli import main
from oasr.engine import Engine, EngineConfig
from tests.serve.harness import WAIT, serving, wav_bytes


def test_oasr_transcribe_runs_parakeet_ctc(ctc_dir, speech, tmp_path, capsys):
    wav = tmp_path / "clip.wav"
    sf.write(wav, speech[1], 16000)
    expected = Engine(EngineConfig(model=str(ctc_dir))).transcribe_outputs(str(wav))
    assert expected.text
    code = main(["transcribe", str(wav), "--model", str(ctc_dir), "-f", "json", "--no-progress"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert json.loads(captured.out)["text"] == expected.text


def test_oasr_serve_runs_parakeet_ctc(ctc_dir, speech):
    engine = Engine(EngineConfig(model=str(ctc_dir)))
    audio = wav_bytes((speech[0] * 32767).astype("int16"))
    expected = engine.transcribe_outputs(audio)
    with serving(engine, served_model_names=("parakeet",)) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=WAIT)
        result = client.audio.transcriptions.create(file=("clip.wav", audio), model="parakeet")
    assert expected.text and result.text == expected.text
