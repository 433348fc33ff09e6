"""Stream chunks are normalised by the one audio normaliser (oasr.audio.stream_chunk), as offline audio."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from oasr.audio import load, stream_chunk
from oasr.engine import Engine, EngineConfig
from oasr.errors import AudioError, OasrError
from tests.engine.conftest import synth


def test_a_chunk_is_read_as_offline_audio_is():
    pcm = (synth(0.3, seed=1) * 32767).astype(np.int16)
    expected = load(pcm, 16000)
    for form in (pcm, pcm.tobytes(), torch.from_numpy(pcm), np.stack([pcm, pcm]), np.stack([pcm, pcm], axis=1),
                 pcm.astype(np.float32) / 32768.0):
        np.testing.assert_array_equal(stream_chunk(form), expected)
    assert stream_chunk(np.zeros(0, np.float32)).size == 0


@pytest.mark.parametrize(("chunk", "message"), [
    (np.array([0.1, np.nan], np.float32), "non-finite"),
    (b"\x00\x01\x02", "whole 16-bit samples"),
    (np.full(8, 300.0, np.float32), "must lie in \\[-1, 1\\]"),
    (np.zeros((2, 2, 2), np.float32), "expected 1-D samples"),
])
def test_a_bad_chunk_is_refused_alone(toy_dirs, chunk, message):
    engine = Engine(EngineConfig(model=str(toy_dirs["slot"]), service_mode="streaming", max_streams=2))
    engine.add_streaming_request(request_id="bad")
    engine.add_streaming_request(request_id="good")
    with pytest.raises(AudioError, match=message) as err:
        engine.feed_chunk("bad", chunk)
    assert isinstance(err.value, OasrError) and "stream bad" in str(err.value)
    audio = synth(1.0, seed=3)
    engine.feed_chunk("good", (audio * 32767).astype(np.int16).tobytes(), is_last=True)
    engine.feed_chunk("bad", audio, is_last=True)
    outs = {}
    while engine.has_unfinished_requests():
        outs.update({o.request_id: o for o in engine.step() if o.finished})
    assert outs["good"].finish_reason == outs["bad"].finish_reason == "stop"
