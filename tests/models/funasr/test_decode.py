"""The ``paraformer`` decode strategy's contract: long audio refused (never truncated), a bad row
fails alone, options it cannot honour refused at admission."""

from __future__ import annotations

import numpy as np
import pytest

import oasr
from oasr.engine import DecodingOptions
from oasr.errors import ConfigError, RequestError
from oasr_models_funasr.decode import MAX_AUDIO_SECONDS


@pytest.fixture(scope="module")
def engine(model_dirs):
    return oasr.Engine(oasr.EngineConfig(model=str(model_dirs[("Paraformer", "small")])))


def test_long_audio_is_refused_and_its_batch_mates_decode(engine, clips):
    long = np.tile(clips[-1][1], int(MAX_AUDIO_SECONDS // 7) + 2)
    assert long.size / 16000 > MAX_AUDIO_SECONDS
    short = clips[0][1]
    outputs = engine.transcribe_outputs([short, long, short])
    assert outputs[1].finish_reason == "error"
    assert f"longer than the {MAX_AUDIO_SECONDS:g} s" in outputs[1].error and "VAD" in outputs[1].error
    assert outputs[0].text and outputs[0].text == outputs[2].text
    with pytest.raises(RequestError, match="longer than"):
        engine.transcribe(long)


def test_the_limit_is_a_decode_option(model_dirs, clips):
    tight = oasr.Engine(oasr.EngineConfig(model=str(model_dirs[("Paraformer", "small")]),
                                          decode_options={"max_audio_seconds": 2.0}))
    out = tight.transcribe_outputs(clips[-1][1])
    assert out.finish_reason == "error" and "2 s" in out.error
    with pytest.raises(ConfigError, match="max_audio_seconds|nonsense"):
        oasr.Engine(oasr.EngineConfig(model=str(model_dirs[("Paraformer", "small")]), decode_options={"nonsense": 1}))


def test_unsupported_request_options_are_refused_at_admission(engine, clips):
    with pytest.raises(RequestError, match="beam_size"):
        engine.add_request(clips[0][1], decoding=DecodingOptions(beam_size=4))


def test_confidences_are_probabilities(engine, clips):
    out = engine.transcribe_outputs(clips[0][1])
    assert 0.0 < out.confidence <= 1.0
