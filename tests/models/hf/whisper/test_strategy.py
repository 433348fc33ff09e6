"""The ``aed`` strategy: registration, request validation, per-request options, batching across requests."""

from __future__ import annotations

import pytest
import torch

from oasr.decoding.strategy import DecodeBatch, DecodeContext
from oasr.engine.options import DecodingOptions
from oasr.errors import RequestError
from oasr_models_hf.whisper.decode import AedDecodeStrategy
from oasr_models_hf.whisper.longform import AedOptions

from .conftest import h


def _strategy(loaded, tokenizer, options: AedOptions | None = None) -> AedDecodeStrategy:
    ctx = DecodeContext(model=loaded.model, tokenizer=tokenizer, decoding_defaults=loaded.decoding_defaults,
                        feature_config=None, device=torch.device("cpu"))
    return AedDecodeStrategy(ctx, options)


@pytest.fixture(scope="module")
def tiny_strategy(tiny):
    from oasr.tokenizers import build_tokenizer

    return _strategy(tiny, build_tokenizer(tiny.tokenizer_spec, tiny.tokenizer_root))


def _run(strategy, clips, options):
    if isinstance(options, DecodingOptions):
        options = [options] * len(clips)
    batch = DecodeBatch(request_ids=[str(i) for i in range(len(clips))], options=list(options),
                        waveforms=[torch.from_numpy(c) for c in clips])
    return strategy.decode(batch)


def test_registered_as_the_aed_decoder_and_the_default_model(tiny_en_dir):
    from pathlib import Path

    from oasr import plugins
    from oasr_models_hf.plugin import DEFAULT_MODEL
    from oasr_models_hf.whisper.assets import resolve_tiny_en

    assert plugins.registry("decoders").get("aed").load() is AedDecodeStrategy
    alias = plugins.registry("aliases").get(DEFAULT_MODEL)
    assert alias.meta["default"] is True
    assert Path(resolve_tiny_en()) == tiny_en_dir
    assert AedDecodeStrategy.needs_features is False and AedDecodeStrategy.supports_long_form is True


@pytest.mark.parametrize(("options", "param"), [
    (DecodingOptions(language="de"), "language"),
    (DecodingOptions(task="translate"), "task"),
    (DecodingOptions(n_best=3), "n_best"),
    (DecodingOptions(max_new_tokens=300), "max_new_tokens"),
    (DecodingOptions(hotwords=("oasr",)), "hotwords"),
])
def test_requests_it_cannot_honour_are_refused(tiny_en_strategy, options, param):
    with pytest.raises(RequestError) as info:
        tiny_en_strategy.validate(options, request_id="r1")
    assert info.value.param == param and info.value.request_id == "r1"


def test_supported_requests_pass(tiny_en_strategy, tiny_strategy):
    tiny_en_strategy.validate(DecodingOptions(language="en", beam_size=4, n_best=2, word_timestamps=True,
                                              timestamps=True, temperature=(0.0, 0.4), prompt="Beckett",
                                              max_new_tokens=100))
    tiny_strategy.validate(DecodingOptions(language="de", task="translate"))
    assert tiny_en_strategy.word_timing_modes == ("cross_attention",)


def test_prompt_language_and_task_shape_the_decoder_prompt(tiny, tiny_strategy):
    gen = tiny.config.generation
    transcriber = tiny_strategy.transcriber
    mel = torch.zeros(80, 3000 + 500)
    prompt_ids = tiny_strategy.ctx.tokenizer.encode(" hello there")
    sot = [gen.sot_id, gen.languages["de"], gen.translate_id]
    for options, tail in ((DecodingOptions(language="de", task="translate", initial_prompt="hello there"), []),
                          (DecodingOptions(language="de", task="translate", prompt="hello there",
                                           without_timestamps=True), [gen.no_timestamps_id])):
        req = transcriber._prepare(0, mel, options)
        req.sot_sequence = transcriber._sot_sequence(req)
        task = transcriber._task(req, 0.0)
        assert task.prompt == [gen.sot_prev_id, *prompt_ids, *sot, *tail]
        assert task.sot_index == 1 + len(prompt_ids)
        assert task.timestamps is not options.without_timestamps


def test_language_is_detected_when_not_given(tiny, tiny_strategy, tiny_openai):
    clips = [h.chirp_audio(4, 200 + 90 * i, i) for i in range(3)]
    hyps = _run(tiny_strategy, clips, DecodingOptions(max_new_tokens=5))
    mels = [tiny_strategy.log_mels([torch.from_numpy(c)])[0] for c in clips]
    with torch.no_grad():
        tokens, _ = tiny_openai.detect_language(torch.stack([m[:, :3000] for m in mels]))
    codes = {v: k for k, v in tiny.config.generation.languages.items()}
    assert [hyp.language for hyp in hyps] == [codes[t] for t in tokens.tolist()]


def test_a_bad_request_fails_alone(tiny_strategy):
    clips = [h.chirp_audio(3, 300, 0), h.chirp_audio(3, 400, 1)]
    out = _run(tiny_strategy, clips, [DecodingOptions(language="xx"), DecodingOptions(language="en",
                                                                                      max_new_tokens=5)])
    assert isinstance(out[0], Exception) and "xx" in str(out[0])
    assert not isinstance(out[1], Exception) and len(out[1].tokens) <= 5


def test_temperature_fallback(tiny_strategy):
    clip = [h.chirp_audio(3, 250, 3)]
    # a log-probability floor no result can reach forces every fallback step
    strict = dict(language="en", logprob_threshold=0.0, no_speech_threshold=None, max_new_tokens=8)
    falls = _run(tiny_strategy, clip, DecodingOptions(temperature=(0.0, 0.3, 0.7), **strict))[0]
    assert falls.segments[0].temperature == 0.7
    stays = _run(tiny_strategy, clip, DecodingOptions(temperature=0.0, **strict))[0]
    assert stays.segments[0].temperature == 0.0
    relaxed = _run(tiny_strategy, clip, DecodingOptions(language="en", temperature=(0.0, 0.3), max_new_tokens=8))[0]
    assert relaxed.segments[0].temperature in (0.0, 0.3)


def test_long_form_requests_batched_equal_each_alone(tiny_strategy):
    """Windows of different requests (other lengths, other seeks) decoded together equal the requests
    decoded one at a time."""
    clips = [h.chirp_audio(41, 200, 7), h.chirp_audio(8, 350, 8), h.chirp_audio(66, 120, 9)]
    options = DecodingOptions(language="en", max_new_tokens=40, temperature=0.0)  # no sampled fallback
    together = _run(tiny_strategy, clips, options)
    for clip, hyp in zip(clips, together, strict=True):
        alone = _run(tiny_strategy, [clip], options)[0]
        assert hyp.tokens == alone.tokens
        assert [(s.start, s.end, s.tokens) for s in hyp.segments] == \
            [(s.start, s.end, s.tokens) for s in alone.segments]
    assert len(together[2].segments) >= 2  # the 66 s request really took several windows
    assert all(a.start <= b.start for a, b in zip(together[2].segments, together[2].segments[1:], strict=False))


def test_n_best_of_a_beam(tiny_en_strategy, beckett):
    hyp = _run(tiny_en_strategy, [beckett], DecodingOptions(beam_size=5, n_best=3, without_timestamps=True))[0]
    assert len(hyp.nbest) == 3
    assert hyp.nbest[0].text == hyp.text and len({n.text for n in hyp.nbest}) == 3


def test_n_best_past_one_window_is_refused_for_that_request(tiny_strategy):
    out = _run(tiny_strategy, [h.chirp_audio(35, 200, 1)], DecodingOptions(language="en", beam_size=2, n_best=2))
    assert isinstance(out[0], RequestError)


def test_engine_transcribes_with_the_default_model(beckett, tiny_en_strategy):
    import oasr

    engine = oasr.Engine(oasr.EngineConfig())
    out = engine.transcribe([beckett])
    reference = _run(tiny_en_strategy, [beckett], DecodingOptions())[0]
    text = out[0] if isinstance(out[0], str) else out[0].text
    assert text == reference.text
