"""CTC greedy and prefix beam search (reference path) against WeNet's fixture and brute force."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from oasr.decoding.ctc import CtcPrefixBeamState, ctc_greedy_search, ctc_prefix_beam_search
from oasr.errors import ConfigError

from .conftest import exhaustive_label_posteriors, random_log_probs

WENET_CASES = [(clip, mode) for clip in ("clip0", "clip1") for mode in ("offline", "chunk4_left-1", "chunk4_left2")]


def load_wenet(fixtures_dir, clip, mode):
    ref = fixtures_dir / "wenet_u2pp" / "ref"
    tensors = load_file(str(ref / f"{clip}.safetensors"))
    results = json.loads((ref / "results.json").read_text())["clips"][clip][mode]
    return tensors[f"{mode}.ctc_log_probs"], tensors, results


def check_against_wenet(fixtures_dir, clip, mode, search):
    """``search(log_probs (1, T, V)) -> n-best``: compare with WeNet's beam-10 prefix search."""
    log_probs, tensors, results = load_wenet(fixtures_dir, clip, mode)
    nbest = search(log_probs[None])
    expected = [[t for t in row if t >= 0] for row in tensors[f"{mode}.prefix_nbest"].tolist()]
    assert [h.tokens for h in nbest] == expected == results["prefix_nbest"]
    # float64 scores, bit for bit
    assert [h.score for h in nbest] == tensors[f"{mode}.prefix_nbest_scores"].tolist()
    assert [h.token_frames for h in nbest] == results["prefix_nbest_times"]
    for h in nbest:
        posteriors = [float(np.exp(np.float64(log_probs[f, u]))) for f, u in zip(h.token_frames, h.tokens, strict=True)]
        assert h.token_confidences == pytest.approx(posteriors, rel=1e-12)


@pytest.mark.parametrize(("clip", "mode"), WENET_CASES)
def test_prefix_beam_equals_wenet_fixture(fixtures_dir, reference_path, clip, mode):
    check_against_wenet(fixtures_dir, clip, mode,
                        lambda lp: ctc_prefix_beam_search(lp, [lp.shape[1]], beam_size=10)[0])


@pytest.mark.parametrize(("clip", "mode"), WENET_CASES)
def test_greedy_equals_wenet_fixture(fixtures_dir, clip, mode):
    log_probs, tensors, results = load_wenet(fixtures_dir, clip, mode)
    hyp = ctc_greedy_search(log_probs[None], [log_probs.shape[0]])[0]
    assert hyp.tokens == tensors[f"{mode}.ctc_greedy_hyp"].tolist() == results["ctc_greedy"]


def test_batched_rows_with_padding_equal_single_rows(fixtures_dir, reference_path):
    a, _, _ = load_wenet(fixtures_dir, "clip0", "offline")
    b, _, _ = load_wenet(fixtures_dir, "clip1", "offline")
    batch = torch.full((2, b.shape[0], b.shape[1]), -3.0)
    batch[0, :a.shape[0]], batch[1] = a, b
    joint = ctc_prefix_beam_search(batch, torch.tensor([a.shape[0], b.shape[0]]), beam_size=10, n_best=3)
    for row, lp in enumerate((a, b)):
        alone = ctc_prefix_beam_search(lp[None], [lp.shape[0]], beam_size=10)[0][:3]
        assert [(h.tokens, h.score, h.token_frames) for h in joint[row]] == \
            [(h.tokens, h.score, h.token_frames) for h in alone]


@pytest.mark.parametrize("seed", range(12))
def test_wide_beam_equals_exhaustive_enumeration(reference_path, seed):
    g = torch.Generator().manual_seed(seed)
    frames, vocab = 1 + seed % 6, 2 + seed % 3
    blank = seed % vocab
    log_probs = random_log_probs(g, 1, frames, vocab)
    exact = exhaustive_label_posteriors(log_probs[0], blank=blank)
    nbest = ctc_prefix_beam_search(log_probs, [frames], beam_size=2000, blank=blank)[0]
    found = {tuple(h.tokens): h.score for h in nbest}
    assert found.keys() == exact.keys()
    for labels, score in exact.items():
        assert found[labels] == pytest.approx(score, abs=1e-9)
    scores = [h.score for h in nbest]
    assert scores == sorted(scores, reverse=True)


@pytest.mark.parametrize("seed", range(6))
def test_blank_skip_sums_over_alignments_blank_on_skipped_frames(reference_path, seed):
    g = torch.Generator().manual_seed(100 + seed)
    frames, vocab = 5, 3
    logits = torch.randn(1, frames, vocab, generator=g) * 2
    logits[0, ::2, 0] += 3.0  # make some frames confidently blank
    log_probs = logits.log_softmax(-1)
    threshold = 0.7
    forced = {t for t in range(frames) if float(log_probs[0, t, 0].exp()) >= threshold}
    assert forced and len(forced) < frames
    exact = exhaustive_label_posteriors(log_probs[0], forced_blank=forced)
    nbest = ctc_prefix_beam_search(log_probs, [frames], beam_size=500, blank_skip_threshold=threshold)[0]
    assert {tuple(h.tokens): pytest.approx(h.score, abs=1e-9) for h in nbest} == exact


def test_greedy_equals_argmax_collapse():
    g = torch.Generator().manual_seed(7)
    log_probs = random_log_probs(g, 5, 40, 6, scale=3.0)
    log_probs[1] = log_probs[1].round()  # exact ties: the lowest id wins
    log_probs[1] -= log_probs[1].logsumexp(-1, keepdim=True)
    lengths = torch.tensor([40, 33, 1, 0, 17])
    hyps = ctc_greedy_search(log_probs, lengths, blank=2)
    for row, hyp in enumerate(hyps):
        n = int(lengths[row])
        lp = log_probs[row, :n].double().numpy()
        path = lp.argmax(-1)
        tokens, frames, confidences = [], [], []
        for label, group in itertools.groupby(enumerate(path), key=lambda x: x[1]):
            run = [f for f, _ in group]
            if label != 2:
                tokens.append(int(label))
                frames.append(run[0])
                confidences.append(float(np.exp(lp[run, label].max())))
        assert hyp.tokens == tokens and hyp.token_frames == frames
        assert hyp.token_confidences == pytest.approx(confidences, rel=1e-12)
        assert hyp.score == pytest.approx(float(lp.max(-1).sum()) if n else 0.0, rel=1e-12)


@pytest.mark.parametrize("chunks", [[1], [3, 5, 1], [17], [200]])
def test_stream_state_equals_offline_search(reference_path, chunks):
    g = torch.Generator().manual_seed(11)
    log_probs = random_log_probs(g, 1, 60, 7)
    offline = ctc_prefix_beam_search(log_probs, [60], beam_size=6, n_best=4)[0]
    state = CtcPrefixBeamState(beam_size=6)
    start, i = 0, 0
    while start < 60:
        size = chunks[i % len(chunks)]
        state.advance(log_probs[0, start:start + size])
        start, i = start + size, i + 1
        assert state.frames == min(start, 60)
    assert [(h.tokens, h.score, h.token_frames) for h in state.results(4)] == \
        [(h.tokens, h.score, h.token_frames) for h in offline]
    assert len(state.results()) == 6


def test_empty_rows_and_bad_arguments(reference_path):
    log_probs = torch.zeros(2, 3, 4).log_softmax(-1)
    empty = ctc_prefix_beam_search(log_probs, [0, 0], beam_size=3)
    assert [[(h.tokens, h.score, h.token_frames) for h in row] for row in empty] == [[([], 0.0, [])]] * 2
    with pytest.raises(ConfigError, match="beam_size"):
        ctc_prefix_beam_search(log_probs, [3, 3], beam_size=0)
    with pytest.raises(ConfigError, match="lengths"):
        ctc_prefix_beam_search(log_probs, [3, 4])
    with pytest.raises(ConfigError, match="lengths"):
        ctc_greedy_search(log_probs, [3])
    with pytest.raises(ConfigError, match="blank"):
        ctc_greedy_search(log_probs, [3, 3], blank=4)
    with pytest.raises(ConfigError, match=r"\(B, T, V\)"):
        ctc_prefix_beam_search(log_probs[0], [3])
    with pytest.raises(ConfigError, match="blank_skip_threshold"):
        ctc_prefix_beam_search(log_probs, [3, 3], blank_skip_threshold=2.0)
