"""openai-whisper ``transcribe()`` options per request, on the trained tiny.en, against ``transcribe`` itself:
clip ranges, the initial prompt, suppressed tokens, conditioning, skipping silence around hallucinations,
and the ``best_of`` ranking of samples."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from oasr.decoding.strategy import DecodeBatch
from oasr.engine.options import DecodingOptions
from oasr.errors import RequestError

from .conftest import h


@pytest.fixture(scope="module")
def openai_tiny_en(tiny_en):
    loaded, _ = tiny_en
    return h.openai_model(loaded.config, loaded.model.state_dict(), loaded.config.generation.alignment_heads)


def _ours(strategy, audio, options: DecodingOptions):
    torch.manual_seed(0)
    out = strategy.decode(DecodeBatch(request_ids=["r"], options=[options], waveforms=[torch.from_numpy(audio)]))[0]
    assert not isinstance(out, BaseException), out
    return out


def _openai(model, audio, **kwargs):
    import whisper

    torch.manual_seed(0)
    return whisper.transcribe(model, audio, fp16=False, **kwargs)


def _same(ours, ref) -> None:
    assert ours.text == ref["text"].strip()
    assert [(round(s.start, 2), round(s.end, 2), s.text) for s in ours.segments] == \
        [(round(s["start"], 2), round(s["end"], 2), s["text"].strip()) for s in ref["segments"]]


@pytest.fixture(scope="module")
def gappy(beckett, espeak_clips):
    """Speech, 12 s of silence, speech, 4 s of silence, speech: windows that end in silence."""
    quiet = np.zeros(12 * h.SAMPLE_RATE, np.float32)
    return np.concatenate([beckett, quiet, espeak_clips[0][1], quiet[: 4 * h.SAMPLE_RATE], espeak_clips[2][1]])


@pytest.mark.parametrize("kwargs", [
    dict(clip_timestamps=(2.0, 12.5, 17.0)),
    dict(clip_timestamps="0,6.2,8,14"),
    dict(initial_prompt="Samuel Beckett, Worstward Ho."),
    dict(condition_on_previous_text=False),
    dict(suppress_tokens=(-1, 13, 11)),  # "." and "," never emitted
    dict(suppress_tokens=()),
    dict(compression_ratio_threshold=1.2, logprob_threshold=None, temperature=(0.0, 0.5)),
], ids=["clip-to-end", "clip-pairs", "initial-prompt", "no-conditioning", "suppress", "suppress-none", "thresholds"])
def test_options_equal_openai_transcribe(tiny_en_strategy, openai_tiny_en, sample_wav, kwargs):
    ours = _ours(tiny_en_strategy, sample_wav, DecodingOptions(**kwargs))
    ref_kwargs = {k: (",".join(str(v) for v in val) if k == "suppress_tokens" else val) for k, val in kwargs.items()}
    _same(ours, _openai(openai_tiny_en, sample_wav, **ref_kwargs))
    if "clip_timestamps" in kwargs:
        first = DecodingOptions(clip_timestamps=kwargs["clip_timestamps"]).clip_timestamps[0]
        assert ours.segments and ours.segments[0].start >= first - 1e-6
    if kwargs.get("suppress_tokens") == (-1, 13, 11):
        assert not {13, 11} & set(ours.tokens)


def test_hallucination_silence_threshold_equals_openai(tiny_en_strategy, openai_tiny_en, gappy):
    options = DecodingOptions(word_timestamps=True, hallucination_silence_threshold=2.0)
    ours = _ours(tiny_en_strategy, gappy, options)
    ref = _openai(openai_tiny_en, gappy, word_timestamps=True, hallucination_silence_threshold=2.0)
    _same(ours, ref)
    assert [(w.word, w.start, w.end) for w in ours.words] == \
        [(w["word"], w["start"], w["end"]) for s in ref["segments"] for w in s["words"]]


def test_best_of_keeps_the_best_ranked_sample(tiny_en_strategy, espeak_clips):
    from oasr_models_hf.whisper.longform import Transcriber

    audio = espeak_clips[1][1]
    options = DecodingOptions(temperature=1.0, best_of=5, without_timestamps=True)
    picked = _ours(tiny_en_strategy, audio, options)
    transcriber = tiny_en_strategy.transcriber
    mel = tiny_en_strategy.log_mels([torch.from_numpy(audio)])[0]
    candidates = []
    with torch.inference_mode():
        req = transcriber._prepare(0, mel, options)
        req.sot_sequence = transcriber._sot_sequence(req)
        size = mel.shape[-1] - 3000  # the window the loop decodes: the clip's frames, zero-padded
        enc = transcriber._encode(torch.nn.functional.pad(mel[:, :size], (0, 3000 - size))[None])
        cross_k, cross_v = transcriber.model.decoder.cross_kv(enc)
        torch.manual_seed(0)
        from oasr_models_hf.whisper.search import search_windows

        index = torch.zeros(5, dtype=torch.long)
        candidates = search_windows(transcriber.model.decoder, [k[index] for k in cross_k],
                                    [v[index] for v in cross_v], [transcriber._task(req, 1.0)] * 5, transcriber.gen)
    assert len({tuple(c.tokens) for c in candidates}) > 1  # the samples differ
    best = Transcriber._best_sample(candidates, None)
    assert picked.tokens == [t for t in best.tokens if t < transcriber.gen.eot_id]
    assert all(best.sum_logprob / len(best.tokens) >= c.sum_logprob / len(c.tokens) for c in candidates)


@pytest.mark.parametrize(("options", "param"), [
    (DecodingOptions(hallucination_silence_threshold=1.0), "hallucination_silence_threshold"),
    (DecodingOptions(clip_timestamps=(5.0, 2.0)), "clip_timestamps"),
    (DecodingOptions(clip_timestamps=(-1.0,)), "clip_timestamps"),
    (DecodingOptions(prompt="a", initial_prompt="b"), "initial_prompt"),
    (DecodingOptions(suppress_tokens=(60000,)), "suppress_tokens"),
    (DecodingOptions(patience=0.0), "patience"),
])
def test_bad_option_values_are_refused(tiny_en_strategy, options, param):
    with pytest.raises(RequestError) as info:
        tiny_en_strategy.validate(options, request_id="r1")
    assert info.value.param == param
