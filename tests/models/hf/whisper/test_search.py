"""Window search (greedy and beam, with and without timestamp tokens) against transformers' generate,
openai-whisper's decode and CTranslate2's generate, all on the same tiny random weights and features."""

from __future__ import annotations

import pytest
import torch

from oasr_models_hf.whisper.search import WindowTask, search_windows

SOT = [50258, 50259, 50359]  # <|startoftranscript|> <|en|> <|transcribe|>
NO_TS = 50363
MAX_NEW = 30


def _prompt(timestamps: bool) -> list[int]:
    return SOT if timestamps else SOT + [NO_TS]


def _ours(tiny, feats, timestamps, beam=None, style="openai"):
    model = tiny.model
    with torch.no_grad():
        enc, _ = model.encode_offline(feats.transpose(1, 2))
        ks, vs = model.decoder.cross_kv(enc)
        tasks = [WindowTask(prompt=_prompt(timestamps), sot_index=0, timestamps=timestamps, beam_size=beam,
                            max_new_tokens=MAX_NEW, beam_style=style) for _ in range(len(feats))]
        return search_windows(model.decoder, ks, vs, tasks, tiny.config.generation)


def _varied(results) -> None:
    assert len({tuple(r.tokens) for r in results}) == len(results), "random model gave repeated outputs"


def test_greedy_equals_transformers_generate(tiny, hf_model, chirp_features):
    ours = _ours(tiny, chirp_features, False)
    _varied(ours)
    with torch.no_grad():
        ref = hf_model.generate(chirp_features, language="en", task="transcribe", return_timestamps=False,
                                max_new_tokens=MAX_NEW)
    for got, row in zip(ours, ref.tolist()):
        assert got.tokens == [t for t in row if t != 50257]


def _first_segment(tokens: list[int], ts_begin: int) -> list[int]:
    """Tokens up to the first closed segment (two timestamps in a row), or all of them."""
    for j in range(1, len(tokens)):
        if tokens[j - 1] >= ts_begin and tokens[j] >= ts_begin:
            return tokens[:j]
    return tokens


def test_greedy_with_timestamps_equals_transformers_generate(tiny, hf_model, chirp_features):
    """transformers' short-form generate with timestamps goes on differently once a segment closes (it
    starts a new one from its own state); up to there it must agree.  openai-whisper and CTranslate2
    (below) check whole windows."""
    ts_begin = tiny.config.generation.timestamp_begin
    ours = _ours(tiny, chirp_features, True)
    _varied(ours)
    with torch.no_grad():
        ref = hf_model.generate(chirp_features, language="en", task="transcribe", return_timestamps=True,
                                max_new_tokens=MAX_NEW)
    compared = 0
    for got, row in zip(ours, ref.tolist()):
        mine = _first_segment(got.tokens, ts_begin)
        assert mine == _first_segment([t for t in row if t != 50257], ts_begin)
        compared += len(mine)
    assert compared > 3 * MAX_NEW


@pytest.mark.parametrize("beam", [None, 5])
@pytest.mark.parametrize("timestamps", [False, True])
def test_search_equals_openai_whisper_decode(tiny, tiny_openai, chirp_features, timestamps, beam):
    from whisper.decoding import DecodingOptions, decode

    ours = _ours(tiny, chirp_features, timestamps, beam)
    _varied(ours)
    options = DecodingOptions(language="en", without_timestamps=not timestamps, fp16=False, sample_len=MAX_NEW,
                              beam_size=beam)
    with torch.no_grad():
        # openai-whisper's beam search runs one window at a time
        refs = [decode(tiny_openai, chirp_features[i:i + 1], options)[0] for i in range(len(chirp_features))]
    for got, ref in zip(ours, refs):
        assert got.tokens == ref.tokens
        assert got.avg_logprob == pytest.approx(ref.avg_logprob, abs=1e-4)
        assert got.no_speech_prob == pytest.approx(ref.no_speech_prob, rel=1e-3, abs=1e-9)


@pytest.mark.parametrize(("timestamps", "beam"), [(False, 1), (False, 5), (True, 5)])
def test_search_equals_ctranslate2_generate(tiny, ct2_dirs, chirp_features, timestamps, beam):
    import ctranslate2

    ours = _ours(tiny, chirp_features, timestamps, beam if beam > 1 else None)
    model = ctranslate2.models.Whisper(str(ct2_dirs["float32"]), compute_type="float32", intra_threads=1)
    feats = ctranslate2.StorageView.from_array(chirp_features.numpy())
    # CTranslate2 emits at most max_length // 2 new tokens
    refs = model.generate(feats, [_prompt(timestamps)] * len(chirp_features), max_length=2 * MAX_NEW,
                          beam_size=beam)
    for got, ref in zip(ours, refs):
        assert got.tokens == list(ref.sequences_ids[0])


def test_beam_rows_and_greedy_rows_share_one_call(tiny, chirp_features):
    """Windows with different beam sizes and prompts in one call equal each decoded alone."""
    model = tiny.model
    gen = tiny.config.generation
    tasks = [WindowTask(prompt=_prompt(i % 2 == 0), sot_index=0, timestamps=i % 2 == 0, beam_size=(None, 3, 5)[i % 3],
                        max_new_tokens=12) for i in range(len(chirp_features))]
    tasks[1].prompt = [gen.sot_prev_id, 400, 500] + tasks[1].prompt
    tasks[1].sot_index = 3
    with torch.no_grad():
        enc, _ = model.encode_offline(chirp_features.transpose(1, 2))
        ks, vs = model.decoder.cross_kv(enc)
        together = search_windows(model.decoder, ks, vs, tasks, gen)
        for i, task in enumerate(tasks):
            alone = search_windows(model.decoder, [k[i:i + 1] for k in ks], [v[i:i + 1] for v in vs], [task], gen)[0]
            assert together[i].tokens == alone.tokens
            assert together[i].sum_logprob == pytest.approx(alone.sum_logprob, rel=1e-4)


def test_n_best_candidates_are_ranked(tiny, chirp_features):
    results = _ours(tiny, chirp_features[:2], False, beam=5)
    for r in results:
        scores = [c.score for c in r.candidates]
        assert len(r.candidates) >= 5 and scores == sorted(scores, reverse=True)
        assert r.candidates[0].tokens == r.tokens


def test_sampling_at_a_temperature_is_seeded_and_varies(tiny, chirp_features):
    model = tiny.model
    with torch.no_grad():
        enc, _ = model.encode_offline(chirp_features[:1].transpose(1, 2))
        ks, vs = model.decoder.cross_kv(enc)
        task = WindowTask(prompt=_prompt(False), sot_index=0, timestamps=False, temperature=1.0, max_new_tokens=10)
        runs = [search_windows(model.decoder, ks, vs, [task], tiny.config.generation,
                               generator=torch.Generator().manual_seed(seed))[0].tokens for seed in (1, 1, 2)]
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_transformers_style_beam_equals_transformers_beam_search(tiny, hf_model, chirp_features):
    ours = _ours(tiny, chirp_features, False, beam=5, style="transformers")
    _varied(ours)
    with torch.no_grad():
        ref = hf_model.generate(chirp_features, language="en", task="transcribe", return_timestamps=False,
                                max_new_tokens=MAX_NEW, num_beams=5)
    for got, row in zip(ours, ref.tolist()):
        assert got.tokens == [t for t in row if t != 50257]
