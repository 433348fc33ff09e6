"""The offline engine: batching equals one-at-a-time, failure isolation, admission refusals, threads."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import soundfile as sf

from oasr.engine import DecodingOptions, Engine, EngineConfig
from oasr.errors import CapabilityError, ConfigError, RequestError, TranscriptionError, UnknownModelError
from tests.engine.conftest import synth


@pytest.fixture(scope="module")
def inputs():
    rng = np.random.default_rng(7)
    return [synth(float(rng.uniform(0.3, 4.0)), seed=i) for i in range(50)]


@pytest.fixture(scope="module")
def reference(tinyctc_dir, inputs):
    """Each input transcribed alone (batch size 1).

    The guard can fail: batching, ordering and padding bugs are only visible if the outputs differ from
    one input to the next, so the tiny model must emit varied tokens, and no frame may be a near-tie
    that a different batch shape's GEMM rounding could flip (the comparisons below are exact).
    """
    engine = Engine(EngineConfig(model=str(tinyctc_dir), max_batch_size=1))
    outs = [engine.transcribe_outputs(x, sample_rate=16000) for x in inputs]
    assert all(o.finish_reason == "stop" for o in outs)
    distinct_ids = {t for o in outs for t in o.tokens}
    assert len(distinct_ids) >= 10, f"the tiny model emits only {sorted(distinct_ids)}"
    assert len({tuple(o.tokens) for o in outs}) >= 45, "the tiny model gives the same output for different inputs"
    margin, noise = _margin_and_batch_noise(engine, inputs)
    assert margin > 10 * noise, f"a frame leads by {margin:.1e} only, while batching moves log-probs by {noise:.1e}"
    return [o.tokens for o in outs]


def _margin_and_batch_noise(engine, inputs) -> tuple[float, float]:
    """The smallest top-1 lead of any frame's CTC log-prob (each input alone), and the largest change of
    any log-prob between running an input alone and in a batch of all 50."""
    import torch

    from oasr.features import extract_features_batch

    model = engine.model
    margin, noise = float("inf"), 0.0
    with torch.no_grad():
        feats, lens = extract_features_batch([torch.from_numpy(x) for x in inputs], engine.feature_config)
        batched, _ = model.forward_offline(feats, lens)
        for i, x in enumerate(inputs):
            feats, lens = extract_features_batch([torch.from_numpy(x)], engine.feature_config)
            log_probs, out_lens = model.forward_offline(feats, lens)
            n = int(out_lens[0])
            top = log_probs[0, :n].topk(2, dim=-1).values
            margin = min(margin, float((top[:, 0] - top[:, 1]).min()))
            noise = max(noise, float((log_probs[0, :n] - batched[i, :n]).abs().max()))
    return margin, noise


@pytest.mark.parametrize("policy", ["fcfs", "bucket", "sjf"])
@pytest.mark.parametrize("max_batch_size,max_batch_frames", [(4, None), (16, None), (50, 3000), (8, 800)])
def test_batched_equals_one_at_a_time(tinyctc_dir, inputs, reference, policy, max_batch_size, max_batch_frames):
    engine = Engine(EngineConfig(model=str(tinyctc_dir), schedule_policy=policy, max_batch_size=max_batch_size,
                                 max_batch_frames=max_batch_frames))
    outs = engine.transcribe_outputs(inputs, sample_rate=16000)
    assert [o.tokens for o in outs] == reference
    snap = engine.metrics_snapshot()
    assert snap["max_batch_size"] > 1 and snap["max_batch_size"] <= max_batch_size
    assert snap["requests_finished"] == {"stop": 50}


def test_a_corrupt_input_fails_alone(tinyctc_dir, inputs, reference, tmp_path):
    bad = tmp_path / "corrupt.wav"
    good = tmp_path / "good.wav"
    sf.write(good, inputs[1], 16000)
    bad.write_bytes(good.read_bytes()[:30])  # a truncated header
    engine = Engine(EngineConfig(model=str(tinyctc_dir), max_batch_size=8))
    outs = engine.transcribe_outputs([inputs[0], str(bad), str(good), inputs[2]], sample_rate=16000)
    assert [o.finish_reason for o in outs] == ["stop", "error", "stop", "stop"]
    assert "corrupt.wav" in outs[1].error
    assert outs[0].tokens == reference[0] and outs[2].tokens == reference[1] and outs[3].tokens == reference[2]
    with pytest.raises(TranscriptionError, match="1 of 2 input") as info:
        engine.transcribe([inputs[0], str(bad)], sample_rate=16000)
    assert isinstance(info.value, RequestError) and info.value.outputs[0].tokens == reference[0]


def test_a_row_that_breaks_the_model_fails_alone(tinyctc_dir, inputs, reference, monkeypatch):
    engine = Engine(EngineConfig(model=str(tinyctc_dir), max_batch_size=8))
    original = engine.strategy.decode

    def flaky(batch):
        if any(w.numel() == inputs[3].size for w in batch.waveforms):
            raise RuntimeError("row 3 poisons any batch it is in")
        return original(batch)

    monkeypatch.setattr(engine.strategy, "decode", flaky)
    outs = engine.transcribe_outputs(inputs[:6], sample_rate=16000)
    assert [o.finish_reason for o in outs] == ["stop"] * 3 + ["error"] + ["stop"] * 2
    assert "row 3 poisons" in outs[3].error
    assert [o.tokens for i, o in enumerate(outs) if i != 3] == [r for i, r in enumerate(reference[:6]) if i != 3]


def test_options_a_family_cannot_honour_are_refused_at_admission(tinyctc_dir, inputs, monkeypatch):
    engine = Engine(EngineConfig(model=str(tinyctc_dir)))
    with pytest.raises(RequestError, match="'ctc'.*cannot honour language"):
        engine.add_request(inputs[0], sample_rate=16000, decoding=DecodingOptions(language="en"))
    with pytest.raises(RequestError, match="cannot honour prompt, task"):
        engine.add_request(inputs[0], sample_rate=16000, decoding=DecodingOptions(task="translate", prompt="hi"))
    assert not engine.has_unfinished_requests()
    # a family without word timings (the mechanism is the strategy's declared supported_options)
    monkeypatch.setattr(engine.strategy, "supported_options", frozenset())
    with pytest.raises(RequestError, match="cannot honour word_timestamps"):
        engine.add_request(inputs[0], sample_rate=16000, decoding=DecodingOptions(word_timestamps=True))


def test_unknown_decode_option_and_method_raise_at_construction(tinyctc_dir):
    with pytest.raises(ConfigError, match="unknown decode option.*beem.*valid: search, beam_size"):
        Engine(EngineConfig(model=str(tinyctc_dir), decode_options={"beem": 3}))
    with pytest.raises(CapabilityError, match="'aed' is not served.*it serves: ctc"):
        Engine(EngineConfig(model=str(tinyctc_dir), decode_method="aed"))
    with pytest.raises(UnknownModelError):
        Engine(EngineConfig(model=str(tinyctc_dir), architecture="no_such_arch"))


def test_word_timestamps_nbest_and_beam(fixtures_dir, tinyctc_dir, inputs):
    """Beam search, n-best and word timings through the engine equal WeNet's own prefix beam search
    (beam 10) on its fixture: the n-best texts, the best tokens, and each word's emission frame."""
    import json

    wenet = fixtures_dir / "wenet_u2pp"
    expected = json.loads((wenet / "ref" / "results.json").read_text())["clips"]["clip0"]["offline"]
    audio, rate = sf.read(fixtures_dir / "audio" / "clip0.wav", dtype="int16")
    units = dict(line.split() for line in (wenet / "model" / "units.txt").read_text().splitlines())
    symbols = {int(i): u for u, i in units.items()}
    engine = Engine(EngineConfig(model=str(wenet / "model")))
    out = engine.transcribe_outputs(audio.astype(np.float32) / 32768.0, sample_rate=rate,
                                    decoding=DecodingOptions(word_timestamps=True, beam_size=10, n_best=3))
    assert out.finish_reason == "stop"
    assert out.tokens == expected["prefix_nbest"][0]
    # WeNet detokenizes "▁" as a space and strips the ends
    assert out.nbest == ["".join(symbols[t] for t in hyp).replace("▁", " ").strip()
                         for hyp in expected["prefix_nbest"][:3]]
    assert out.text == out.nbest[0]
    # one word per token here (a character vocabulary); a token is emitted at its encoder frame (40 ms)
    frame = 0.04
    assert [(w.word, w.start) for w in out.words] == [
        (symbols[t], pytest.approx(time * frame)) for t, time in
        zip(expected["prefix_nbest"][0], expected["prefix_nbest_times"][0], strict=True)]
    assert all(w.start <= w.end <= out.duration for w in out.words)
    tiny = Engine(EngineConfig(model=str(tinyctc_dir)))
    with pytest.raises(RequestError, match="n_best=5 exceeds the beam size 4"):
        tiny.add_request(inputs[0], sample_rate=16000, decoding=DecodingOptions(beam_size=4, n_best=5))


def test_abort_and_queue_bound(tinyctc_dir, inputs):
    from oasr.errors import EngineFullError

    engine = Engine(EngineConfig(model=str(tinyctc_dir), max_queue=2))
    seen = []
    a = engine.add_request(inputs[0], sample_rate=16000, callback=seen.append)
    engine.add_request(inputs[1], sample_rate=16000)
    with pytest.raises(EngineFullError):
        engine.add_request(inputs[2], sample_rate=16000)
    assert engine.abort_request(a) is True
    assert engine.abort_request(a) is False
    assert seen[0].finish_reason == "abort"
    outs = engine.run()
    assert len(outs) == 1 and outs[0].finish_reason == "stop"


def test_thread_safety(tinyctc_dir, inputs, reference):
    engine = Engine(EngineConfig(model=str(tinyctc_dir), max_batch_size=8, max_wait_time=0.0))
    results: dict[int, list[int]] = {}
    done = threading.Event()

    def stepper():
        while not done.is_set():
            if not engine.step():
                done.wait(0.001)

    def submit(indices):
        for i in indices:
            engine.add_request(inputs[i], sample_rate=16000, request_id=f"r{i}",
                               callback=lambda out, i=i: results.__setitem__(i, out.tokens))

    runner = threading.Thread(target=stepper)
    runner.start()
    submitters = [threading.Thread(target=submit, args=(range(k, 50, 4),)) for k in range(4)]
    for t in submitters:
        t.start()
    for t in submitters:
        t.join()
    while engine.has_unfinished_requests():
        done.wait(0.01)
    done.set()
    runner.join()
    assert [results[i] for i in range(50)] == reference


def test_fixed_window_models_refuse_overlong_audio_without_long_form(tinyctc_dir, inputs):
    engine = Engine(EngineConfig(model=str(tinyctc_dir)))
    engine.window_seconds = 2.0  # as a fixed-window frontend would declare
    long_audio = synth(3.0, seed=99)
    with pytest.raises(RequestError, match="fixed 2 s window.*no long-form mode"):
        engine.add_request(long_audio, sample_rate=16000)
    engine.add_request(synth(1.5, seed=98), sample_rate=16000)
    engine2 = Engine(EngineConfig(model=str(tinyctc_dir), max_audio_seconds=1.0))
    with pytest.raises(RequestError, match="longer than the engine's max_audio_seconds=1"):
        engine2.add_request(long_audio, sample_rate=16000)


@pytest.mark.parametrize("method", ["ctc", "ctc_aed_rescoring"])
def test_batched_equals_one_at_a_time_for_the_wenet_conformer(fixtures_dir, inputs, method):
    model = str(fixtures_dir / "wenet_u2pp" / "model")
    alone = Engine(EngineConfig(model=model, decode_method=method, max_batch_size=1))
    expected = [alone.transcribe_outputs(x, sample_rate=16000).tokens for x in inputs[:20]]
    assert sum(map(len, expected)) > 20
    for policy in ("fcfs", "bucket", "sjf"):
        engine = Engine(EngineConfig(model=model, decode_method=method, schedule_policy=policy, max_batch_size=8))
        assert [o.tokens for o in engine.transcribe_outputs(inputs[:20], sample_rate=16000)] == expected


def test_explicit_greedy_temperature_is_accepted_by_every_family(tinyctc_dir, inputs, reference):
    """temperature=0 asks for plain greedy decoding, which a CTC family does; a sampling temperature it
    cannot honour is refused in one clear error."""
    engine = Engine(EngineConfig(model=str(tinyctc_dir)))
    out = engine.transcribe_outputs(inputs[3], sample_rate=16000, decoding=DecodingOptions(temperature=0.0))
    assert out.tokens == reference[3]
    with pytest.raises(RequestError, match="temperature"):
        engine.add_request(inputs[0], sample_rate=16000, decoding=DecodingOptions(temperature=0.7))
