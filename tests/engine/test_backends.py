"""The ``slot`` and ``stateful`` streaming backends, driven by the example family's toy encoder.

The toy encoder (tests/plugins/oasr-toyfamily) is causal with per-layer widths and kernels, so each
layer's state is its own shape, and a chunk computes exactly what the whole utterance does: a
stream's transcript must equal the offline one.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from oasr.engine import DecodingOptions, Engine, EngineConfig
from oasr.engine.backends import BACKENDS, SlotBackend, StatefulBackend, build_backend
from oasr.errors import CapabilityError, RequestError
from oasr.models import BaseEncoder
from tests.engine.conftest import synth

SECONDS = [0.8 + 0.17 * i for i in range(16)]


@pytest.fixture(scope="module")
def audio():
    return [synth(s, seed=200 + i) for i, s in enumerate(SECONDS)]


def offline_tokens(path, audio, language=None):
    engine = Engine(EngineConfig(model=str(path)))
    decoding = DecodingOptions(language=language)
    outs = engine.transcribe_outputs(list(audio), sample_rate=16000, decoding=decoding)
    return [o.tokens for o in outs], engine


def test_the_toy_margins_are_far_above_float_noise(toy_dirs, audio):
    """Token comparisons below must not hinge on near-ties: every frame's winning class leads by more
    than ten times the measured difference between a chunked and a whole-utterance pass."""
    from oasr.features import extract_features_batch

    _, engine = offline_tokens(toy_dirs["stateful"], audio[:1])
    model = engine.model
    feats, lens = extract_features_batch([torch.from_numpy(a) for a in audio], engine.feature_config)
    noise, leads = 0.0, []
    with torch.inference_mode():
        for prompt in (0, 1):  # en (no language asked) and fr
            hidden, out_lens = model.encode(feats, lens, torch.full((len(audio),), prompt))
            logits = model.classifier(hidden)
            for row in range(len(audio)):
                n = int(out_lens[row])
                state, chunks = model.encoder.init_stream_state(1), []
                state["prompt"].fill_(prompt)
                for start in range(0, int(lens[row]), 6):
                    window = feats[row:row + 1, start:min(start + 6, int(lens[row]))]
                    h, _, state = model.encoder.forward_chunk_stateful(window, state)
                    chunks.append(h[0])
                chunked = model.classifier(torch.cat(chunks))
                noise = max(noise, float((chunked[:n] - logits[row, :n]).abs().max()))
                top = logits[row, :n].topk(2, dim=-1).values
                leads.append(top[:, 0] - top[:, 1])
    assert 0 < noise < 1e-4
    assert float(torch.cat(leads).min()) > 10 * noise


@pytest.mark.parametrize("kind", ["slot", "stateful"])
def test_sixteen_interleaved_streams_and_an_abort_equal_offline(toy_dirs, audio, kind):
    expected, _ = offline_tokens(toy_dirs[kind], audio)
    assert sum(len(t) > 2 for t in expected) >= 14 and len({tuple(t) for t in expected}) >= 14
    engine = Engine(EngineConfig(model=str(toy_dirs[kind]), service_mode="streaming", chunk_size=3, max_streams=16))
    executor = engine._streaming
    assert isinstance(executor.backend, BACKENDS[kind])
    pool_bytes = executor.pool_bytes()
    pointers = {n: t.data_ptr() for n, t in getattr(executor.backend, "states", {}).items()}
    rng = np.random.default_rng(7)
    pos = [0] * 16
    finals: dict[int, list[int] | str] = {}
    def on_output(out):
        if out.finished and out.finish_reason == "abort":
            finals[int(out.request_id[1:])] = "abort"

    for i in range(16):
        engine.add_streaming_request(request_id=f"s{i}", callback=on_output)
    steps = 0
    while len(finals) < 16:
        for i in rng.permutation(16):
            if i in finals or pos[i] >= audio[i].size or rng.random() < 0.3:
                continue
            n = int(rng.integers(160, 5000))
            engine.feed_chunk(f"s{i}", audio[i][pos[i]:pos[i] + n], is_last=pos[i] + n >= audio[i].size)
            pos[i] += n
        if steps == 5:
            assert engine.abort_request("s9")
        for out in engine.step():
            if out.finished:
                finals[int(out.request_id[1:])] = out.tokens if out.finish_reason == "stop" else out.finish_reason
        assert executor.pool_bytes() == pool_bytes
        steps += 1
        assert steps < 3000
    assert finals.pop(9) == "abort"
    assert finals == {i: expected[i] for i in range(16) if i != 9}
    assert executor.active_streams() == 0 and executor.streams == {}
    assert {n: t.data_ptr() for n, t in getattr(executor.backend, "states", {}).items()} == pointers


def test_slot_states_are_declared_per_layer(toy_dirs):
    engine = Engine(EngineConfig(model=str(toy_dirs["slot"]), service_mode="streaming", chunk_size=2, max_streams=4))
    shapes = {n: tuple(t.shape) for n, t in engine._streaming.backend.states.items()}
    assert shapes == {"conv0": (4, 2, 24), "conv1": (4, 4, 16), "prompt": (4,)}


def test_persistent_state_is_written_at_admission(toy_dirs, audio):
    """A stream's language prompt is written when it is admitted, so the stream after it in the same
    slot does not inherit it, and it is honoured at all (an unwritten prompt reads as 'en')."""
    path = toy_dirs["slot"]
    (french,), _ = offline_tokens(path, audio[3:4], language="fr")
    (plain,), _ = offline_tokens(path, audio[4:5])
    (french_as_en,), _ = offline_tokens(path, audio[3:4])
    assert french != french_as_en  # the prompt changes the transcript
    engine = Engine(EngineConfig(model=str(path), service_mode="streaming", chunk_size=3, max_streams=1))
    got = []
    for rid, clip, lang in (("fr", audio[3], "fr"), ("plain", audio[4], None)):
        engine.add_streaming_request(request_id=rid, decoding=DecodingOptions(language=lang))
        engine.feed_chunk(rid, clip, is_last=True)
        outs = []
        while engine.has_unfinished_requests():
            outs += engine.step()
        got.append(outs[-1].tokens)
    assert got == [french, plain]


def test_a_turn_reset_keeps_the_request_state_and_forgets_the_audio(toy_dirs, audio):
    engine = Engine(EngineConfig(model=str(toy_dirs["slot"]), service_mode="streaming", chunk_size=2, max_streams=2))
    executor = engine._streaming
    engine.add_streaming_request(request_id="a", decoding=DecodingOptions(language="de"))
    engine.feed_chunk("a", audio[0][:8000])
    engine.step()
    engine.step()
    slot = executor.streams["a"].slot
    states = executor.backend.states
    assert int(states["prompt"][slot]) == 2 and bool(states["conv1"][slot].abs().sum() > 0)
    assert executor.reset_turn("a")
    assert int(states["prompt"][slot]) == 2
    assert float(states["conv0"][slot].abs().sum()) == 0 == float(states["conv1"][slot].abs().sum())
    assert executor.streams["a"].offset == 0
    assert not executor.reset_turn("nobody")


def test_an_unknown_language_is_refused_at_admission(toy_dirs):
    engine = Engine(EngineConfig(model=str(toy_dirs["slot"]), service_mode="streaming"))
    with pytest.raises(RequestError, match="language 'xx' is not one of this model's: en, fr, de"):
        engine.add_streaming_request(decoding=DecodingOptions(language="xx"))


def test_the_backend_table_names_the_valid_kinds(toy_dirs):
    engine = Engine(EngineConfig(model=str(toy_dirs["slot"])))
    engine.model.encoder.streaming_kind = "ring"
    kw = dict(max_streams=1, chunk_size=2, num_left_chunks=-1, max_chunks=4, dtype=torch.float32,
              device=torch.device("cpu"), lock=None)
    with pytest.raises(CapabilityError, match="unknown streaming_kind 'ring'.*valid: paged, slot, stateful or 'none'"):
        build_backend(engine.model, **kw)
    engine.model.encoder.streaming_kind = "slot"

    class HalfSlot(BaseEncoder):
        streaming_kind = "slot"

    with pytest.raises(CapabilityError, match="streaming_kind='slot' but lacks forward_chunk_slots"):
        SlotBackend(SimpleNamespace(encoder=HalfSlot()), **kw)
    assert isinstance(StatefulBackend(engine.model, **kw), StatefulBackend)
