"""The streaming executor's end-of-stream padding and its construction hook, driven by the toy encoder.

An encoder may declare ``streaming_tail_frames`` of ``streaming_pad_value`` (icefall's recipe pads
every utterance's features with LOG_EPS frames before its last windows): the executor appends them
after the stream's last feature frame, so the final windows carry them and one more window runs
where they make the stream reach it.  ``prepare_streaming(chunk_size, num_left_chunks)`` is called
once at construction, before the backend reads the encoder's state specs, and may refuse.
"""

from __future__ import annotations

import math

import pytest
import torch

from oasr.engine import Engine, EngineConfig
from oasr.errors import CapabilityError
from oasr.models import BaseEncoder
from tests.engine.conftest import synth

TAIL, PAD = 5, -7.25


def test_the_base_encoder_declares_no_tail_and_an_inert_hook():
    assert BaseEncoder.streaming_tail_frames == 0 and BaseEncoder.streaming_pad_value == 0.0
    assert BaseEncoder.prepare_streaming(BaseEncoder(), 16, -1) is None


def _record_windows(monkeypatch, encoder_class, seen):
    original = encoder_class.forward_chunk_slots

    def recording(self, feats, feat_lens, offsets, states):
        for row in range(feats.shape[0]):
            seen.append(feats[row, : int(feat_lens[row])].clone())
        return original(self, feats, feat_lens, offsets, states)

    monkeypatch.setattr(encoder_class, "forward_chunk_slots", recording)


def test_tail_frames_are_appended_after_the_last_feature_frame(toy_dirs, monkeypatch):
    from oasr_toyfamily.model import ToyFrameEncoder

    from oasr.features import extract_features_batch

    monkeypatch.setattr(ToyFrameEncoder, "streaming_tail_frames", TAIL, raising=False)
    monkeypatch.setattr(ToyFrameEncoder, "streaming_pad_value", PAD, raising=False)
    seen: list[torch.Tensor] = []
    _record_windows(monkeypatch, ToyFrameEncoder, seen)
    engine = Engine(EngineConfig(model=str(toy_dirs["slot"]), service_mode="streaming", chunk_size=3))
    audio = synth(1.03, seed=11)
    feats, lens = extract_features_batch([torch.from_numpy(audio)], engine.feature_config)
    frames = int(lens[0])
    out = engine.transcribe_outputs([audio], sample_rate=16000)[0]
    assert out.finished and out.error is None
    stride = engine._streaming.geometry.stride_frames
    # every window starting before the padded end runs, the last one ending in the pad frames
    assert len(seen) == math.ceil((frames + TAIL) / stride)
    streamed = torch.cat(seen)
    assert streamed.shape[0] == frames + TAIL
    torch.testing.assert_close(streamed[:frames], feats[0, :frames], atol=1e-4, rtol=1e-4)
    assert torch.equal(streamed[frames:], torch.full((TAIL, feats.shape[-1]), PAD))


def test_without_a_tail_the_windows_end_at_the_last_feature_frame(toy_dirs, monkeypatch):
    from oasr_toyfamily.model import ToyFrameEncoder

    from oasr.features import extract_features_batch

    seen: list[torch.Tensor] = []
    _record_windows(monkeypatch, ToyFrameEncoder, seen)
    engine = Engine(EngineConfig(model=str(toy_dirs["slot"]), service_mode="streaming", chunk_size=3))
    audio = synth(1.03, seed=11)
    _, lens = extract_features_batch([torch.from_numpy(audio)], engine.feature_config)
    engine.transcribe_outputs([audio], sample_rate=16000)
    assert torch.cat(seen).shape[0] == int(lens[0])


def test_prepare_streaming_is_called_with_the_engine_geometry_and_may_refuse(toy_dirs, monkeypatch):
    from oasr_toyfamily.model import ToyFrameEncoder

    calls = []

    def prepare(self, chunk_size, num_left_chunks):
        calls.append((chunk_size, num_left_chunks, hasattr(self, "streaming_state_specs")))
        if chunk_size == 5:
            raise CapabilityError("toy refuses chunk 5", capability="streaming")

    monkeypatch.setattr(ToyFrameEncoder, "prepare_streaming", prepare, raising=False)
    Engine(EngineConfig(model=str(toy_dirs["slot"]), service_mode="streaming", chunk_size=3, num_left_chunks=2))
    assert calls == [(3, 2, True)]
    with pytest.raises(CapabilityError, match="toy refuses chunk 5"):
        Engine(EngineConfig(model=str(toy_dirs["slot"]), service_mode="streaming", chunk_size=5))
