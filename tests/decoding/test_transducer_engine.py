"""The ``transducer`` family through the public Engine, offline and streaming, on an architecture of the
tests' own (``toytransducer``: the example family's causal slot-streaming toy encoder plus a stateless
predictor and a joiner, see ``_transducer_engine_toys.py``).

Offline results are checked against the icefall-style per-utterance oracles of test_transducer.py run
on the engine's own features and encoder output; streaming (the slot backend, 16 interleaved streams)
against offline.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from oasr.engine import DecodingOptions, Engine, EngineConfig
from oasr.features import extract_features_batch
from tests.decoding._transducer_engine_toys import toytransducer_registered, write_checkpoint
from tests.decoding.test_transducer import oracle_beam, oracle_greedy
from tests.engine.conftest import synth

SECONDS = [0.6 + 0.13 * i for i in range(16)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    with toytransducer_registered():
        yield write_checkpoint(tmp_path_factory.mktemp("toytransducer") / "ckpt", seed=0)


@pytest.fixture(scope="module")
def audio():
    return [synth(s, seed=400 + i) for i, s in enumerate(SECONDS)]


def _hidden(engine, audio):
    feats, lens = extract_features_batch([torch.from_numpy(a) for a in audio], engine.feature_config)
    with torch.inference_mode():
        return engine.model.encode_offline(feats, lens)


def test_offline_greedy_and_beam_equal_the_per_utterance_oracles(checkpoint, audio):
    engine = Engine(EngineConfig(model=str(checkpoint)))
    assert engine.decode_method == "transducer"
    greedy = engine.transcribe_outputs(audio, sample_rate=16000, decoding=DecodingOptions(word_timestamps=True))
    beam = engine.transcribe_outputs(audio[:6], sample_rate=16000, decoding=DecodingOptions(beam_size=4, n_best=2))
    hidden, lens = _hidden(engine, audio)
    model = engine.model
    gaps = []
    with torch.inference_mode():
        for row, out in enumerate(greedy):
            tokens, _, gap = oracle_greedy(model.predictor, model.joiner, hidden[row, :int(lens[row])], 1)
            gaps.append(gap)
            assert out.tokens == tokens, row
            assert out.words and out.words[-1].end <= SECONDS[row] + 0.05
        for row, out in enumerate(beam):
            _, best, margin = oracle_beam(model.predictor, model.joiner, hidden[row, :int(lens[row])], 4)
            assert margin > 1e-4 and out.tokens == list(best), row
            assert len(out.nbest) == 2
    assert min(gaps) > 1e-4  # float32 batching noise is ~1e-6: no greedy decision is a near-tie
    assert len({tuple(o.tokens) for o in greedy}) == len(audio) and min(len(o.tokens) for o in greedy) >= 3
    assert any(b.tokens != g.tokens for b, g in zip(beam, greedy, strict=False))
    alone = [engine.transcribe_outputs(a, sample_rate=16000).tokens for a in audio[:4]]
    assert alone == [o.tokens for o in greedy[:4]]


@pytest.mark.parametrize("decoding", [DecodingOptions(), DecodingOptions(beam_size=4)], ids=["greedy", "beam"])
def test_sixteen_interleaved_streams_equal_offline(checkpoint, audio, decoding):
    expected = [o.tokens for o in Engine(EngineConfig(model=str(checkpoint))).transcribe_outputs(
        audio, sample_rate=16000, decoding=decoding)]
    engine = Engine(EngineConfig(model=str(checkpoint), service_mode="streaming", chunk_size=3, max_streams=16))
    pool = engine._streaming.pool_bytes()
    rng = np.random.default_rng(11)
    pos = [0] * 16
    for i in range(16):
        engine.add_streaming_request(request_id=f"s{i}", decoding=decoding)
    finals: dict[int, list[int]] = {}
    steps = 0
    while len(finals) < 16:
        for i in rng.permutation(16):
            if pos[i] >= audio[i].size or rng.random() < 0.3:
                continue
            n = int(rng.integers(160, 4000))
            engine.feed_chunk(f"s{i}", audio[i][pos[i]:pos[i] + n], is_last=pos[i] + n >= audio[i].size)
            pos[i] += n
        for out in engine.step():
            if out.finished:
                assert out.finish_reason == "stop", out.error
                finals[int(out.request_id[1:])] = out.tokens
        assert engine._streaming.pool_bytes() == pool
        steps += 1
        assert steps < 3000
    assert finals == dict(enumerate(expected))


def test_a_streaming_request_the_family_cannot_honour_is_refused_alone(checkpoint):
    from oasr.errors import RequestError

    engine = Engine(EngineConfig(model=str(checkpoint), service_mode="streaming", chunk_size=3, max_streams=2))
    with pytest.raises(RequestError, match="n_best=6 exceeds the beam size 4"):
        engine.add_streaming_request(request_id="bad", decoding=DecodingOptions(n_best=6))
    out = engine.transcribe_outputs(synth(0.7, seed=9), sample_rate=16000)
    assert out.finish_reason == "stop" and out.tokens
