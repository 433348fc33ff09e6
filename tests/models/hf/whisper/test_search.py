"""Window search (greedy and beam, with and without timestamp tokens) against transformers' generate,
openai-whisper's decode and CTranslate2's generate, all on the same tiny random weights and features."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from oasr_models_hf.whisper import search
from oasr_models_hf.whisper.search import LogitRules, WindowTask, search_windows

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


# Random weights make near-ties: two float32 implementations may pick different tokens where the top
# two log-probs differ by less than their own rounding noise.  The comparisons below therefore walk the
# reference's tokens and compare step by step while the step's top-1 margin (under OASR's model, with
# openai-whisper's rules applied by an unpatched LogitRules) exceeds NOISE_FACTOR x the measured logit
# difference of the two implementations; a row stops at its first near-tie.  A test then requires that
# most steps were compared, so it cannot pass by comparing nothing.
NOISE_FACTOR = 10.0
#: the least share of reference steps (tokens + end-of-text) that must be compared
MIN_COMPARED = 0.8


def _teacher_forced(tiny, feats, prompt, tokens) -> torch.Tensor:
    """OASR's decoder logits (len(tokens) + 1, V) predicting each of ``tokens`` and then end-of-text."""
    model = tiny.model
    with torch.no_grad():
        enc, _ = model.encode_offline(feats[None].transpose(1, 2))
        seq = torch.tensor([prompt + tokens])
        _, hidden = model.decoder.prefill(enc, seq, torch.tensor([seq.shape[1]]))
        return model.decoder.logits(hidden[0, len(prompt) - 1:]).float()


def _step_margins(tiny, logits, tokens, timestamps) -> list[float]:
    """The top-1 margin of the filtered log-probs at each step of ``tokens`` (+ end-of-text)."""
    rules = LogitRules(tiny.config.generation, logits.shape[-1], logits.device)
    margins = []
    for t in range(len(tokens) + 1):
        row = logits[t:t + 1].clone()
        rules.apply(row, [tokens[:t]], [timestamps])
        top = F.log_softmax(row, dim=-1)[0].topk(2).values
        margins.append(float(top[0] - top[1]))
    return margins


def _assert_equal_above_noise(tiny, feats, timestamps, ours, refs, noise, *, complete=True) -> None:
    """``ours[i]`` equals ``refs[i]`` (token lists, end-of-text excluded) at every step before the row's
    first near-tie (margin <= NOISE_FACTOR x ``noise``), and at least MIN_COMPARED of all steps compared.
    ``complete=False``: the references are prefixes, so the step after them is not compared."""
    bound = NOISE_FACTOR * noise
    compared = total = 0
    for i, (got, ref) in enumerate(zip(ours, refs, strict=True)):
        prompt = _prompt(timestamps)
        margins = _step_margins(tiny, _teacher_forced(tiny, feats[i], prompt, ref), ref, timestamps)
        margins = margins if complete else margins[:-1]
        total += len(margins)
        reference = ref + [None]  # None: the step that ends the window
        mine = got + [None]
        for t, margin in enumerate(margins):
            if margin <= bound:
                break
            assert t < len(mine) and mine[t] == reference[t], (
                f"window {i} step {t}: OASR {mine[t:t + 3]} != reference {reference[t:t + 3]} "
                f"where the reference leads by {margin:.2e} (noise bound {bound:.1e})")
            compared += 1
    assert compared >= MIN_COMPARED * total, f"only {compared} of {total} steps were above the noise bound"


def _noise(tiny, feats, timestamps, refs, reference_logits) -> float:
    """The largest |OASR - reference| logit difference over the reference's teacher-forced windows;
    ``reference_logits(i, prompt + tokens)`` gives the reference's logits (L, V) at every position."""
    worst = 0.0
    for i, ref in enumerate(refs):
        prompt = _prompt(timestamps)
        ours = _teacher_forced(tiny, feats[i], prompt, ref)
        with torch.no_grad():
            theirs = reference_logits(i, prompt + ref)[len(prompt) - 1:].float()
        worst = max(worst, float((ours - theirs).abs().max()))
    assert 0.0 < worst < 1e-2, f"implausible logit difference {worst} between OASR and the reference"
    return worst


def _sequence_logprob(tiny, feats, prompt, tokens, timestamps, *, masked=True) -> float:
    """Log-probability of ``tokens`` + end-of-text under OASR's model (after the rules if ``masked``)."""
    logits = _teacher_forced(tiny, feats, prompt, tokens)
    rules = LogitRules(tiny.config.generation, logits.shape[-1], logits.device)
    eot = tiny.config.generation.eot_id
    total = 0.0
    for t, token in enumerate(tokens + [eot]):
        row = logits[t:t + 1].clone()
        if masked:
            rules.apply(row, [tokens[:t]], [timestamps])
        total += float(F.log_softmax(row, dim=-1)[0, token])
    return total


def _assert_beams_equal_or_tied(tiny, feats, timestamps, ours, refs, noise, *, masked=True) -> list[bool]:
    """Beam search keeps whole hypotheses: a row equals the reference, or both hypotheses score within
    the noise bound under OASR's model (a tie the two implementations may break either way).  At least
    two thirds of the rows must be equal.  Returns which rows were equal."""
    bound = NOISE_FACTOR * noise
    equal = []
    for i, (got, ref) in enumerate(zip(ours, refs, strict=True)):
        equal.append(got == ref)
        if got != ref:
            prompt = _prompt(timestamps)
            mine = _sequence_logprob(tiny, feats[i], prompt, got, timestamps, masked=masked)
            theirs = _sequence_logprob(tiny, feats[i], prompt, ref, timestamps, masked=masked)
            assert abs(mine - theirs) <= bound * (len(got) + len(ref)), (
                f"window {i}: OASR {got} scores {mine:.5f}, reference {ref} scores {theirs:.5f}")
    assert sum(equal) >= 2 * len(equal) / 3, f"only {sum(equal)} of {len(equal)} beam results equal"
    return equal


def test_greedy_equals_transformers_generate(tiny, hf_model, chirp_features):
    ours = _ours(tiny, chirp_features, False)
    _varied(ours)
    with torch.no_grad():
        ref = hf_model.generate(chirp_features, language="en", task="transcribe", return_timestamps=False,
                                max_new_tokens=MAX_NEW)
    refs = [[t for t in row if t != 50257] for row in ref.tolist()]
    noise = _noise(tiny, chirp_features, False, refs, _hf_logits(hf_model, chirp_features))
    _assert_equal_above_noise(tiny, chirp_features, False, [r.tokens for r in ours], refs, noise)


def _hf_logits(hf_model, feats):
    def logits(i, tokens):
        return hf_model(input_features=feats[i:i + 1], decoder_input_ids=torch.tensor([tokens])).logits[0]
    return logits


def _openai_logits(tiny_openai, feats):
    def logits(i, tokens):
        audio = tiny_openai.encoder(feats[i:i + 1])
        return tiny_openai.logits(torch.tensor([tokens]), audio)[0]
    return logits


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
    refs = [_first_segment([t for t in row if t != 50257], ts_begin) for row in ref.tolist()]
    assert sum(map(len, refs)) > 3 * MAX_NEW
    noise = _noise(tiny, chirp_features, True, refs, _hf_logits(hf_model, chirp_features))
    _assert_equal_above_noise(tiny, chirp_features, True, [r.tokens for r in ours], refs, noise, complete=False)


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
    ref_tokens = [list(r.tokens) for r in refs]
    noise = _noise(tiny, chirp_features, timestamps, ref_tokens, _openai_logits(tiny_openai, chirp_features))
    if beam is None:
        _assert_equal_above_noise(tiny, chirp_features, timestamps, [r.tokens for r in ours], ref_tokens, noise)
        equal = [got.tokens == ref for got, ref in zip(ours, ref_tokens, strict=True)]
    else:
        equal = _assert_beams_equal_or_tied(tiny, chirp_features, timestamps, [r.tokens for r in ours], ref_tokens,
                                            noise)
    for got, ref, same in zip(ours, refs, equal, strict=True):
        assert got.no_speech_prob == pytest.approx(ref.no_speech_prob, rel=1e-3, abs=1e-9)
        if same:
            assert got.avg_logprob == pytest.approx(ref.avg_logprob, abs=1e-4)


#: CTranslate2 exposes no logits to measure: the float32 noise measured against openai-whisper and
#: transformers on this model is ~1e-4, stated here
CT2_NOISE = 1e-4


@pytest.mark.parametrize(("timestamps", "beam"), [(False, 1), (False, 5), (True, 5)])
def test_search_equals_ctranslate2_generate(tiny, ct2_dirs, chirp_features, timestamps, beam):
    import ctranslate2

    ours = _ours(tiny, chirp_features, timestamps, beam if beam > 1 else None)
    model = ctranslate2.models.Whisper(str(ct2_dirs["float32"]), compute_type="float32", intra_threads=1)
    feats = ctranslate2.StorageView.from_array(chirp_features.numpy())
    # CTranslate2 emits at most max_length // 2 new tokens
    refs = model.generate(feats, [_prompt(timestamps)] * len(chirp_features), max_length=2 * MAX_NEW,
                          beam_size=beam)
    ref_tokens = [list(r.sequences_ids[0]) for r in refs]
    got = [r.tokens for r in ours]
    if beam == 1:
        _assert_equal_above_noise(tiny, chirp_features, timestamps, got, ref_tokens, CT2_NOISE)
    else:
        _assert_beams_equal_or_tied(tiny, chirp_features, timestamps, got, ref_tokens, CT2_NOISE)


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
    refs = [[t for t in row if t != 50257] for row in ref.tolist()]
    noise = _noise(tiny, chirp_features, False, refs, _hf_logits(hf_model, chirp_features))
    _assert_beams_equal_or_tied(tiny, chirp_features, False, [r.tokens for r in ours], refs, noise, masked=False)


class _TimestampRulesBlindToHistory(LogitRules):
    """openai-whisper's rules broken on purpose: the timestamp rules do not see the timestamps already
    generated (so segments need not close in pairs and timestamps may decrease)."""

    def _timestamp_rules(self, logits, rows, generated):
        saved = self.ts_begin
        try:
            super()._timestamp_rules(logits, rows, [[t for t in seq if t < saved] for seq in generated])
        finally:
            self.ts_begin = saved


def test_the_noise_guarded_comparison_still_fails_on_a_broken_timestamp_rule(tiny, tiny_openai, chirp_features,
                                                                             monkeypatch):
    """The test of the test: with one timestamp rule broken, the guarded comparison must fail."""
    from whisper.decoding import DecodingOptions, decode

    options = DecodingOptions(language="en", without_timestamps=False, fp16=False, sample_len=MAX_NEW)
    with torch.no_grad():
        refs = [list(decode(tiny_openai, chirp_features[i:i + 1], options)[0].tokens) for i in range(len(chirp_features))]
    noise = _noise(tiny, chirp_features, True, refs, _openai_logits(tiny_openai, chirp_features))
    _assert_equal_above_noise(tiny, chirp_features, True, [r.tokens for r in _ours(tiny, chirp_features, True)],
                              refs, noise)
    monkeypatch.setattr(search, "LogitRules", _TimestampRulesBlindToHistory)
    broken = [r.tokens for r in _ours(tiny, chirp_features, True)]
    with pytest.raises(AssertionError, match="OASR"):
        _assert_equal_above_noise(tiny, chirp_features, True, broken, refs, noise)
