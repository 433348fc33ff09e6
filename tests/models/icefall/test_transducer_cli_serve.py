"""An icefall Zipformer transducer through the user-facing surfaces: ``oasr transcribe DIR
--architecture transducer`` and ``oasr serve`` (HTTP transcription, and the realtime WebSocket on
the streaming engine with the causal release), each checked against icefall's own token ids."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import openai
import pytest

from oasr.engine import DecodingOptions, Engine, EngineConfig
from tests.serve.harness import WAIT, check_realtime_transcripts, oasr_serve_process, serving

from .conftest import CLIPS, clip_path, refs, release_dir

CAUSAL = "zipformer_transducer_causal"
#: the causal fixture streams with icefall's chunk 16 and the 64-frame left context it was trained with
STREAM_FLAGS = ("--chunk-size", "16", "--num-left-chunks", "4")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "oasr.cli", *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def audio_dir(fixtures_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("clips")
    (root / "sub").mkdir()
    shutil.copy(clip_path(fixtures_dir, "clip0"), root / "clip0.wav")
    shutil.copy(clip_path(fixtures_dir, "clip1"), root / "sub" / "clip1.wav")
    return root


def _outputs(out_dir) -> dict[str, dict]:
    return {clip: json.loads(next(out_dir.rglob(f"{clip}.json")).read_text()) for clip in CLIPS}


def test_transcribe_cli_on_a_directory_gives_icefall_tokens(fixtures_dir, audio_dir, tmp_path):
    model = release_dir(fixtures_dir, "zipformer_transducer")
    ref = refs(fixtures_dir, "zipformer_transducer")
    greedy = _cli("transcribe", str(audio_dir), "--model", str(model), "--architecture", "transducer",
                  "-f", "verbose_json", "-o", str(tmp_path / "greedy"), "--no-progress")
    assert greedy.returncode == 0, greedy.stderr
    beam = _cli("transcribe", str(audio_dir), "--model", str(model), "--architecture", "transducer",
                "-f", "verbose_json", "-o", str(tmp_path / "beam"), "--no-progress", "--beam-size", "4",
                "--word-timestamps")
    assert beam.returncode == 0, beam.stderr
    for clip, result in _outputs(tmp_path / "greedy").items():
        assert [t for s in result["segments"] for t in s["tokens"]] == ref[clip]["greedy_search_batch_hyp"].tolist()
    for clip, result in _outputs(tmp_path / "beam").items():
        assert [t for s in result["segments"] for t in s["tokens"]] == ref[clip]["modified_beam_search_4_hyp"].tolist()
        words = result["words"]
        assert len(words) > 5 and " ".join(w["word"] for w in words) == result["text"]
        starts = [w["start"] for w in words]
        assert starts == sorted(starts) and all(0 <= w["start"] <= w["end"] <= result["duration"] for w in words)


def test_transcribe_cli_without_the_architecture_flag_does_not_load_a_transducer(fixtures_dir, audio_dir, tmp_path):
    """Not auto-detected: the directory is claimed by the Zipformer CTC converter, which finds no CTC head."""
    done = _cli("transcribe", str(audio_dir / "clip0.wav"), "--model", str(release_dir(fixtures_dir,
                "zipformer_transducer")), "--no-progress")
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "architecture='transducer'" in done.stderr


@pytest.mark.parametrize("search", ["greedy", "modified_beam"])
def test_serve_http_answers_with_icefall_transcripts(fixtures_dir, search):
    """``oasr serve --decode-option search=...``'s engine: plain and word-timed transcriptions."""
    model = release_dir(fixtures_dir, "zipformer_transducer")
    engine = Engine(EngineConfig(model=str(model), architecture="transducer", decode_options={"search": search}))
    ref = refs(fixtures_dir, "zipformer_transducer")
    key = "greedy_search_batch_hyp" if search == "greedy" else "modified_beam_search_4_hyp"
    payloads = {clip: clip_path(fixtures_dir, clip).read_bytes() for clip in CLIPS}
    expected = {clip: engine.transcribe_outputs(payloads[clip], decoding=DecodingOptions(word_timestamps=True))
                for clip in CLIPS}
    for clip in CLIPS:
        assert expected[clip].tokens == ref[clip][key].tolist()
    with serving(engine, served_model_names=("zipformer-rnnt",)) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=WAIT)
        for clip in CLIPS:
            plain = client.audio.transcriptions.create(file=(f"{clip}.wav", payloads[clip]), model="zipformer-rnnt")
            assert plain.text == expected[clip].text and plain.text
            timed = client.audio.transcriptions.create(file=(f"{clip}.wav", payloads[clip]), model="zipformer-rnnt",
                                                       response_format="verbose_json",
                                                       timestamp_granularities=["word"])
            assert [(w.word, w.start, w.end) for w in timed.words] == [
                (w.word, round(w.start, 3), round(w.end, 3)) for w in expected[clip].words]
            assert len(timed.words) > 5


# -- `oasr serve --streaming` on the causal release: HTTP upload + realtime WebSocket ----------------
@pytest.fixture(scope="module")
def streaming_reference(fixtures_dir) -> dict[str, str]:
    """The in-process streaming engine's transcripts, whose tokens are icefall's ``decode_one_chunk`` loop's."""
    engine = Engine(EngineConfig(model=str(release_dir(fixtures_dir, CAUSAL)), architecture="transducer",
                                 service_mode="streaming", chunk_size=16, num_left_chunks=4, max_streams=2))
    ref = refs(fixtures_dir, CAUSAL)
    texts = {}
    for clip in CLIPS:
        out = engine.transcribe_outputs(clip_path(fixtures_dir, clip).read_bytes())
        assert out.tokens == ref[clip]["stream.greedy_search_hyp"].tolist()
        texts[clip] = out.text
    return texts


@pytest.fixture(scope="module")
def serve_process(fixtures_dir):
    with oasr_serve_process(["--model", str(release_dir(fixtures_dir, CAUSAL)), "--architecture", "transducer",
                             "--streaming", *STREAM_FLAGS, "--max-streams", "4", "--served-model-name", "rnnt",
                             "--no-access-log", "--log-level", "warning", "--threads", "1"]) as served:
        yield served.port
    assert f"serving rnnt (transducer, transducer, streaming) on http://127.0.0.1:{served.port}/v1" in served.stderr


def test_oasr_serve_streaming_http_upload(fixtures_dir, serve_process, streaming_reference):
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{serve_process}/v1", api_key="none", max_retries=0,
                           timeout=WAIT)
    assert [m.id for m in client.models.list()] == ["rnnt"]
    for clip in CLIPS:
        text = client.audio.transcriptions.create(file=(f"{clip}.wav", clip_path(fixtures_dir, clip).read_bytes()),
                                                  model="rnnt").text
        assert text == streaming_reference[clip] and text


def _pcm16(fixtures_dir, clip: str):
    import soundfile as sf

    samples, rate = sf.read(clip_path(fixtures_dir, clip), dtype="int16")
    assert rate == 16000
    return samples


def test_oasr_serve_realtime_websocket_streams_icefall_hypotheses(fixtures_dir, serve_process, streaming_reference):
    check_realtime_transcripts(serve_process, {clip: _pcm16(fixtures_dir, clip) for clip in CLIPS}, streaming_reference)


def test_a_non_causal_transducer_is_refused_by_the_streaming_engine(fixtures_dir):
    """A non-causal transducer has no streaming mode: the streaming engine refuses it at construction."""
    from oasr.errors import OasrError

    with pytest.raises(OasrError, match="cannot stream"):
        Engine(EngineConfig(model=str(release_dir(fixtures_dir, "zipformer_transducer")), architecture="transducer",
                            service_mode="streaming"))
