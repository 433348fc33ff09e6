"""The WeNet fixture through the offline engine: audio in, WeNet's token ids out."""

from __future__ import annotations

import pytest

from oasr.engine import Engine, EngineConfig

from .conftest import CLIPS


@pytest.mark.parametrize("method,key", [("ctc", "ctc_greedy"), ("ctc_aed_rescoring", "rescoring")])
def test_engine_decodes_the_fixture_like_wenet(model_dir, refs, results, method, key):
    engine = Engine(EngineConfig(model=str(model_dir), decode_method=method))
    assert engine.decode_method == method
    waves = [refs[c]["wav_int16"].float().numpy() / 32768 for c in CLIPS]
    outputs = engine.transcribe_outputs(waves)
    for out, clip in zip(outputs, CLIPS, strict=True):
        expected = results["clips"][clip]["offline"][key]
        assert out.error is None
        assert out.tokens == (expected["tokens"] if method == "ctc_aed_rescoring" else expected)


@pytest.mark.parametrize("left", [-1, 2])
def test_streaming_rescoring_matches_wenets_chunked_rescoring(model_dir, refs, results, left):
    """U2++ streaming: prefix beam chunk by chunk, the n-best rescored once the stream ends."""
    engine = Engine(EngineConfig(model=str(model_dir), service_mode="streaming", chunk_size=4, num_left_chunks=left,
                                 decode_method="ctc_aed_rescoring"))
    waves = [refs[c]["wav_int16"].float().numpy() / 32768 for c in CLIPS]
    outputs = engine.transcribe_outputs(waves, streaming=True)
    for out, clip in zip(outputs, CLIPS, strict=True):
        expected = results["clips"][clip][f"chunk4_left{left}"]["rescoring"]
        assert out.error is None
        assert out.tokens == expected["tokens"]
        assert out.confidence == pytest.approx(expected["confidence"], rel=1e-3)
