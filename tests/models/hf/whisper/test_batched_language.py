"""Batched long-form on a multilingual checkpoint detects the language once per request, as faster-whisper's
``BatchedInferencePipeline`` does (over the first 30 s of its chunks' features joined), not once per chunk.

The tiny random multilingual Whisper of conftest.py (transformers builds it, CTranslate2's converter
converts it; OASR and faster-whisper load the same float32 directory) on espeak-ng sentences with silences
that VAD merges into several chunks.
"""

from __future__ import annotations

import pytest
import torch

from oasr.engine import DecodingOptions, Engine, EngineConfig
from oasr_models_hf.whisper import batched
from oasr_models_hf.whisper.longform import Transcriber
from tests.vad import _audio

#: language probabilities of the two implementations (float32, CTranslate2 vs torch) agree within this
PROB_TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    """The eight sentences twice with pauses: over 55 s of speech, so VAD makes two or three chunks."""
    clips = _audio.sentence_clips(tmp_path_factory.mktemp("batched_language"))
    gaps = [2.0, 3.0, 0.4, 2.5, 4.0, 0.3, 2.2, 3.5, 1.0, 2.8, 0.6, 1.5, 3.2, 0.5, 2.0, 1.2, 2.0]
    return _audio.join(clips + clips, gaps)


@pytest.fixture(scope="module")
def engine(ct2_dirs):
    return Engine(EngineConfig(model=str(ct2_dirs["float32"]), num_threads=1, max_batch_size=4))


@pytest.fixture
def watched(monkeypatch):
    """What the engine detects (rows of each detection, with every language's probability) and the
    language each chunk is decoded in."""
    seen = {"detections": [], "chunk_languages": []}
    detect, task = Transcriber.detect_language, batched._task

    def counting_detect(self, mels):
        out = detect(self, mels)
        seen["detections"].append(out)
        return out

    def recording_task(transcriber, opts, language):
        seen["chunk_languages"].append(language)
        return task(transcriber, opts, language)

    monkeypatch.setattr(Transcriber, "detect_language", counting_detect)
    monkeypatch.setattr(batched, "_task", recording_task)
    return seen


def _faster_whisper_batched(ct2_dir, audio):
    try:
        from faster_whisper import BatchedInferencePipeline, WhisperModel
    except ImportError:
        pytest.fail("faster-whisper (the reference) is not installed: pip install faster-whisper")
    pipeline = BatchedInferencePipeline(WhisperModel(str(ct2_dir), device="cpu", compute_type="float32",
                                                     cpu_threads=1))
    segments, info = pipeline.transcribe(audio, beam_size=1, temperature=0.0, batch_size=4)
    return list(segments), info


def test_one_detection_per_request_equal_to_faster_whispers(engine, ct2_dirs, recording, watched):
    out = engine.transcribe_outputs(recording.audio, decoding=DecodingOptions(batched=True, temperature=0.0))
    assert out.finish_reason == "stop", out.error
    chunks = len(watched["chunk_languages"])
    assert chunks >= 2
    # one detection of one row for the whole request, and every chunk decoded in its language
    assert [len(rows) for rows in watched["detections"]] == [1]
    (language, probs), = watched["detections"][0]
    assert watched["chunk_languages"] == [language] * chunks and out.language == language
    # the detection is faster-whisper's: same window of features, same probabilities, same language
    segments, info = _faster_whisper_batched(ct2_dirs["float32"], recording.audio)
    assert len(segments) == chunks  # without timestamps: one segment per chunk in both
    theirs = dict(info.all_language_probs)
    assert set(theirs) == set(probs)
    assert max(abs(probs[code] - theirs[code]) for code in probs) < PROB_TOLERANCE
    top = sorted(probs.values(), reverse=True)
    assert top[0] - top[1] > 2 * PROB_TOLERANCE, "the detection hinges on a near-tie of the random model"
    assert info.language == language


def test_a_given_language_is_not_detected(engine, recording, watched):
    out = engine.transcribe_outputs(recording.audio, decoding=DecodingOptions(batched=True, temperature=0.0,
                                                                              language="de"))
    assert out.finish_reason == "stop", out.error
    assert watched["detections"] == []
    assert len(watched["chunk_languages"]) >= 2 and set(watched["chunk_languages"]) == {"de"}
    assert out.language == "de"


def test_speech_shorter_than_a_window_is_detected_with_the_pipelines_end_frame(engine, ct2_dirs, recording,
                                                                                watched):
    """Under 30 s of speech: the detected window is the one chunk, the pipeline's end frame and zeros."""
    audio = recording.audio[: recording.spans[2][1] + 8000]
    out = engine.transcribe_outputs(audio, decoding=DecodingOptions(batched=True, temperature=0.0))
    assert out.finish_reason == "stop", out.error
    assert len(watched["chunk_languages"]) == 1 and [len(rows) for rows in watched["detections"]] == [1]
    (language, probs), = watched["detections"][0]
    _, info = _faster_whisper_batched(ct2_dirs["float32"], audio)
    theirs = dict(info.all_language_probs)
    assert max(abs(probs[code] - theirs[code]) for code in probs) < PROB_TOLERANCE
    assert info.language == language == out.language


def test_request_language_window_is_the_joined_features(engine):
    """The detected window: chunk features joined in order, the end frame, zero padding (shape and values)."""
    transcriber = engine.strategy.transcriber
    captured = []
    original = transcriber.detect_language
    transcriber.detect_language = lambda mels: captured.append(mels) or original(mels)
    try:
        waves = [torch.sin(torch.arange(16000 * s) * 0.05 * (i + 1)) * 0.1 for i, s in enumerate((4, 3))]
        with torch.inference_mode():
            batched.request_language(transcriber, iter(waves))
    finally:
        del transcriber.detect_language
    (mel,) = captured
    n_mels, window = transcriber.model.config.num_mel_bins, transcriber.window
    assert mel.shape == (1, n_mels, window)
    first, second = (batched._unpadded_features(w, n_mels) for w in waves)
    assert first.shape[-1] == 400 and second.shape[-1] == 300
    assert torch.equal(mel[0, :, :400], first) and torch.equal(mel[0, :, 400:700], second)
    assert torch.all(mel[0, :, 700] == batched.EMPTY_FRAME_VALUE) and torch.all(mel[0, :, 701:] == 0)
