"""Word timestamps (cross-attention + DTW) and language detection against openai-whisper."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from oasr.decoding.strategy import DecodeBatch
from oasr.engine.options import DecodingOptions
from oasr_models_hf.whisper.timing import dtw, median_filter

from .conftest import h


@pytest.mark.parametrize("shape", [(5, 40), (23, 300), (1, 7)])
def test_dtw_equals_openai(shape):
    from whisper.timing import dtw_cpu

    rng = np.random.default_rng(sum(shape))
    for matrix in (rng.standard_normal(shape), rng.integers(0, 3, shape).astype(np.float64)):  # the second has ties
        ours = dtw(matrix)
        ref = dtw_cpu(matrix)
        assert np.array_equal(ours[0], ref[0]) and np.array_equal(ours[1], ref[1])


def test_median_filter_equals_openai():
    from whisper.timing import median_filter as ref_filter

    x = torch.randn(3, 9, 50)
    assert torch.equal(median_filter(x, 7), ref_filter(x, 7))
    short = torch.randn(2, 3)
    assert torch.equal(median_filter(short, 7), ref_filter(short, 7))
    for tall in (torch.randn(4, 37, 200), torch.randn(33, 90)):  # more rows than one BLOCK_ROWS block
        assert torch.equal(median_filter(tall, 7), ref_filter(tall, 7))


@pytest.mark.parametrize("without_timestamps", [False, True], ids=["with-timestamps", "words-only"])
def test_word_timestamps_equal_openai_transcribe(tiny_en, tiny_en_strategy, beckett, without_timestamps):
    """openai-whisper times words over timestamped segments, so asking for words alone decodes the same."""
    import whisper

    loaded, _ = tiny_en
    options = DecodingOptions(word_timestamps=True, without_timestamps=without_timestamps, temperature=0.0)
    batch = DecodeBatch(request_ids=["b"], options=[options], waveforms=[torch.from_numpy(beckett)])
    ours = tiny_en_strategy.decode(batch)[0]
    model = h.openai_model(loaded.config, loaded.model.state_dict(), loaded.config.generation.alignment_heads)
    ref = whisper.transcribe(model, beckett, temperature=0.0, fp16=False, language="en", word_timestamps=True)
    want = [w for seg in ref["segments"] for w in seg["words"]]
    assert [w.word for w in ours.words] == [w["word"] for w in want]
    assert [(w.start, w.end) for w in ours.words] == [(w["start"], w["end"]) for w in want]
    assert [w.confidence for w in ours.words] == pytest.approx([w["probability"] for w in want], abs=1e-3)
    assert [(s.start, s.end) for s in ours.segments] == [(s["start"], s["end"]) for s in ref["segments"]]
    assert len(ours.words) >= 10
    # every word is a piece of the transcript and words do not go back in time
    assert "".join(w.word for w in ours.words).strip() == ours.text
    assert all(a.start <= b.start for a, b in zip(ours.words, ours.words[1:], strict=False))


def test_language_detection_equals_openai(tiny, tiny_openai, chirp_features):
    from oasr_models_hf.whisper.longform import Transcriber

    transcriber = Transcriber(tiny.model, tokenizer=None)
    with torch.no_grad():
        ours = transcriber.detect_language(chirp_features)
        tokens, probs = tiny_openai.detect_language(chirp_features)
    gen = tiny.config.generation
    assert [gen.languages[code] for code, _ in ours] == tokens.tolist()
    for (_, mine), theirs in zip(ours, probs, strict=True):
        assert mine == pytest.approx(theirs, abs=1e-5)
    assert len({code for code, _ in ours}) > 1  # the random model does not answer one language for all
