"""The streaming engine against WeNet's chunk-by-chunk fixture, and many interleaved streams."""

from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile as sf
import torch
from safetensors.torch import load_file

from oasr.engine import DecodingOptions, Engine, EngineConfig
from oasr.errors import CapabilityError
from tests.engine.conftest import synth


@pytest.fixture(scope="module")
def wenet(fixtures_dir):
    return fixtures_dir / "wenet_u2pp"


@pytest.fixture(scope="module")
def results(wenet):
    return json.loads((wenet / "ref" / "results.json").read_text())["clips"]


def clip(fixtures_dir, name):
    audio, sr = sf.read(fixtures_dir / "audio" / f"{name}.wav", dtype="int16")
    assert sr == 16000
    return audio.astype(np.float32) / 32768.0


def streaming_engine(wenet, **kw):
    return Engine(EngineConfig(model=str(wenet / "model"), service_mode="streaming", chunk_size=4, **kw))


def feed_all(engine, audio, piece, request_id="s", decoding=None, rng=None, sample_rate=None):
    """Feed one stream in pieces (fixed or random sizes) and step until it finishes."""
    engine.add_streaming_request(request_id=request_id, decoding=decoding, sample_rate=sample_rate)
    outputs, pos = [], 0
    while pos < audio.size:
        n = piece if rng is None else int(rng.integers(100, 4000))
        engine.feed_chunk(request_id, audio[pos:pos + n], is_last=pos + n >= audio.size)
        pos += n
        outputs += engine.step()
    while engine.has_unfinished_requests():
        outputs += engine.step()
    return outputs


class FixtureFeatures:
    """Stands in for the streaming frontend: yields the fixture's own fbank rows as audio arrives
    (snip_edges framing: 1 + (n - 400) // 160 frames for n samples), so the engine's streaming
    machinery is compared with WeNet on WeNet's exact input.  The frontend itself is checked
    against torchaudio in tests/features."""

    def __init__(self, fbank: torch.Tensor):
        self.fbank = fbank
        self.samples = 0
        self.emitted = 0

    def reset(self, slot):
        self.samples = self.emitted = 0

    def _take(self, upto: int) -> torch.Tensor:
        upto = min(upto, self.fbank.shape[0])
        rows = self.fbank[self.emitted:upto]
        self.emitted = max(self.emitted, upto)
        return rows

    def process_chunk(self, slot, samples):
        self.samples += samples.numel()
        return self._take(max(0, 1 + (self.samples - 400) // 160))

    def flush(self, slot):
        return self._take(self.fbank.shape[0])


@pytest.mark.parametrize("left", [-1, 2])
@pytest.mark.parametrize("name", ["clip0", "clip1"])
def test_chunk_by_chunk_encoder_output_and_text_equal_wenet(fixtures_dir, wenet, results, name, left):
    ref = load_file(str(wenet / "ref" / f"{name}.safetensors"))
    engine = streaming_engine(wenet, num_left_chunks=left, max_streams=1)
    engine._streaming.extractor = FixtureFeatures(ref["fbank"])
    seen: list[torch.Tensor] = []
    original = engine.model.encoder.forward_chunk

    def spy(*args, **kwargs):
        out = original(*args, **kwargs)
        seen.append(out.hidden[0, : int(out.lengths[0])].clone())
        return out

    engine.model.encoder.forward_chunk = spy
    outputs = feed_all(engine, clip(fixtures_dir, name), piece=1600)
    expected = ref[f"chunk4_left{left}.encoder_out_chunk_by_chunk"]
    got = torch.cat(seen)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    final = outputs[-1]
    assert final.finished and final.finish_reason == "stop"
    assert final.tokens == results[name][f"chunk4_left{left}"]["ctc_greedy"]
    assert any(not o.finished for o in outputs), "partial results arrive before the end"


@pytest.mark.parametrize("left", [-1, 2])
def test_streaming_prefix_beam_and_rescoring_equal_wenet(fixtures_dir, wenet, results, left):
    audio = clip(fixtures_dir, "clip0")
    expected = results["clip0"][f"chunk4_left{left}"]
    engine = streaming_engine(wenet, num_left_chunks=left)
    final = feed_all(engine, audio, 2400, decoding=DecodingOptions(beam_size=10))[-1]
    assert final.tokens == expected["prefix_nbest"][0]
    rescoring = streaming_engine(wenet, num_left_chunks=left, decode_method="ctc_aed_rescoring")
    final = feed_all(rescoring, audio, 2400)[-1]
    assert final.tokens == expected["rescoring"]["tokens"]


@pytest.fixture(scope="module")
def sixteen():
    rng = np.random.default_rng(3)
    return [synth(float(rng.uniform(0.5, 3.5)), seed=100 + i) for i in range(16)]


@pytest.fixture(scope="module")
def alone(wenet, sixteen):
    engine = streaming_engine(wenet, max_streams=1)
    return [feed_all(engine, audio, 3200, request_id=f"a{i}")[-1].tokens for i, audio in enumerate(sixteen)]


def test_sixteen_interleaved_streams_equal_each_alone(wenet, sixteen, alone):
    engine = streaming_engine(wenet, max_streams=16)
    pool = engine._streaming.pool
    total_blocks = len(pool.free_blocks)
    pool_bytes = engine._streaming.pool_bytes()
    k_ptr = pool.k.data_ptr()
    rng = np.random.default_rng(11)
    pos = [0] * 16
    finals: dict[str, list[int] | str] = {}
    aborted = "s5"
    for i in range(16):
        callback = None
        if f"s{i}" == aborted:
            def callback(out):
                if out.finished:
                    finals[out.request_id] = out.finish_reason
        engine.add_streaming_request(request_id=f"s{i}", callback=callback)
    steps = 0
    while len(finals) < 16:
        for i in rng.permutation(16):
            rid = f"s{i}"
            audio = sixteen[i]
            if rid in finals or pos[i] >= audio.size or rng.random() < 0.3:
                continue
            n = int(rng.integers(160, 6000))
            engine.feed_chunk(rid, audio[pos[i]:pos[i] + n], is_last=pos[i] + n >= audio.size)
            pos[i] += n
        if steps == 6:
            assert engine.abort_request(aborted)
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out.tokens if out.finish_reason == "stop" else out.finish_reason
        used = sum(len(s.blocks) for s in engine._streaming.streams.values())
        assert used + len(pool.free_blocks) == total_blocks  # every block accounted for
        steps += 1
        assert steps < 2000
    assert finals[aborted] == "abort"
    for i in range(16):
        if f"s{i}" != aborted:
            assert finals[f"s{i}"] == alone[i], f"stream {i} differs from its solo run"
    assert engine._streaming.pool_bytes() == pool_bytes and pool.k.data_ptr() == k_ptr
    assert len(pool.free_blocks) == total_blocks and engine._streaming.active_streams() == 0


def test_a_long_run_does_not_grow_memory(wenet):
    engine = streaming_engine(wenet, max_streams=2, num_left_chunks=2)
    pool = engine._streaming.pool
    audio = synth(30.0, seed=5)
    engine.add_streaming_request(request_id="long")
    high_water = 0
    for start in range(0, audio.size, 1600):
        engine.feed_chunk("long", audio[start:start + 1600], is_last=start + 1600 >= audio.size)
        engine.step()
        stream = engine._streaming.streams.get("long")
        if stream is not None:
            high_water = max(high_water, len(stream.blocks))
            assert stream.hidden == [] and sum(f.shape[0] for f in stream.feats) < 64
    while engine.has_unfinished_requests():
        engine.step()
    assert high_water == 2  # left-chunk eviction keeps exactly num_left_chunks blocks
    assert len(pool.free_blocks) == pool.k.shape[1]


def test_full_pool_makes_new_streams_wait_and_ceiling_finishes_with_length(wenet, sixteen, alone):
    engine = streaming_engine(wenet, max_streams=2)
    for i in range(4):
        engine.add_streaming_request(request_id=f"w{i}")
        engine.feed_chunk(f"w{i}", sixteen[i], is_last=True)
    finals = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert engine._streaming.active_streams() <= 2
            if out.finished:
                finals[out.request_id] = out.tokens
    assert [finals[f"w{i}"] for i in range(4)] == alone[:4]
    short = streaming_engine(wenet, max_stream_seconds=0.5)
    short.add_streaming_request(request_id="x")
    short.feed_chunk("x", synth(3.0, seed=1), is_last=True)
    outs = []
    while short.has_unfinished_requests():
        outs += short.step()
    assert outs[-1].finish_reason == "length" and outs[-1].finished


def test_transcribe_streaming_equals_feeding(fixtures_dir, wenet, results):
    engine = streaming_engine(wenet)
    out = engine.transcribe_outputs(clip(fixtures_dir, "clip1"), sample_rate=16000, streaming=True)
    assert out.tokens == results["clip1"]["chunk4_left-1"]["ctc_greedy"]


def test_resampled_input_and_word_timings(fixtures_dir, wenet):
    import soxr

    """A stream at 8 kHz is resampled as it arrives: it decodes like the same audio resampled to 16 kHz
    up front, with the same word timings (on the 8 kHz stream's own clock)."""
    narrow = soxr.resample(clip(fixtures_dir, "clip1"), 16000, 8000)
    words = DecodingOptions(word_timestamps=True)
    final = feed_all(streaming_engine(wenet), narrow, 800, decoding=words, sample_rate=8000)[-1]
    reference = feed_all(streaming_engine(wenet), soxr.resample(narrow, 8000, 16000), 1600, decoding=words)[-1]
    assert final.finished and reference.finished and len(reference.tokens) >= 3
    assert final.tokens == reference.tokens and final.text == reference.text
    assert final.duration == pytest.approx(narrow.size / 8000, abs=1e-3)
    assert [(w.word, w.start, w.end) for w in final.words] == [(w.word, w.start, w.end) for w in reference.words]


def test_models_that_cannot_stream_are_refused_at_construction(tinyctc_dir):
    with pytest.raises(CapabilityError, match="cannot stream.*streaming_kind='none'"):
        Engine(EngineConfig(model=str(tinyctc_dir), service_mode="streaming"))


@pytest.mark.parametrize("left", [-1, 2])
def test_offline_with_the_chunk_mask_equals_streaming(fixtures_dir, wenet, results, left):
    audio = clip(fixtures_dir, "clip0")
    offline = Engine(EngineConfig(model=str(wenet / "model"),
                                  model_options={"decoding_chunk_size": 4, "num_decoding_left_chunks": left}))
    streamed = streaming_engine(wenet, num_left_chunks=left).transcribe_outputs(audio, sample_rate=16000,
                                                                              streaming=True)
    out = offline.transcribe_outputs(audio, sample_rate=16000)
    assert out.tokens == streamed.tokens == results["clip0"][f"chunk4_left{left}"]["ctc_greedy"]


def test_unknown_model_option_names_the_valid_ones(wenet):
    from oasr.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown model option.*chunk_size; valid: decoding_chunk_size"):
        Engine(EngineConfig(model=str(wenet / "model"), model_options={"chunk_size": 4}))
