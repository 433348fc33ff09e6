"""Hotword context graph: its bonus arithmetic, and context biasing in prefix beam search."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from oasr.decoding.context import ROOT, ContextGraph
from oasr.decoding.ctc import ctc_prefix_beam_search
from oasr.errors import ConfigError

from .conftest import exhaustive_label_posteriors, random_log_probs


def occurrences_bonus(labels, phrases, bonus):
    """Brute force: every occurrence of a phrase (as a contiguous run) earns bonus × its length."""
    total = 0.0
    for phrase in {tuple(p) for p in phrases}:
        n = len(phrase)
        total += bonus * n * sum(tuple(labels[i:i + n]) == phrase for i in range(len(labels) - n + 1))
    return total


def run_graph(graph, labels):
    state, total = ROOT, 0.0
    for label in labels:
        delta, state = graph.step(state, label)
        total += delta
    return total + graph.finalize(state)


@settings(max_examples=400, deadline=None)
@given(phrases=st.lists(st.lists(st.integers(1, 4), min_size=1, max_size=4), min_size=1, max_size=5),
       labels=st.lists(st.integers(1, 4), max_size=14), bonus=st.sampled_from([0.5, 1.5, 3.0]))
def test_final_bonus_counts_every_completed_phrase_occurrence(phrases, labels, bonus):
    graph = ContextGraph(phrases, score=bonus)
    assert run_graph(graph, labels) == pytest.approx(occurrences_bonus(labels, phrases, bonus), abs=1e-9)


def test_partial_match_is_boosted_during_search_and_taken_back():
    graph = ContextGraph([[5, 6, 7]], score=2.0)
    d1, s1 = graph.step(ROOT, 5)
    d2, s2 = graph.step(s1, 6)
    assert (d1, d2) == (2.0, 2.0) and graph.finalize(s2) == -4.0
    d3, s3 = graph.step(s2, 9)  # the match breaks: its bonus is taken back
    assert d3 == -4.0 and s3 == ROOT


def test_per_phrase_scores_and_errors():
    graph = ContextGraph([[1, 2], [3]], phrase_scores=[1.0, 4.0])
    assert run_graph(graph, [1, 2, 3, 3]) == pytest.approx(2 * 1.0 + 2 * 4.0)
    with pytest.raises(ConfigError, match="no tokens"):
        ContextGraph([[1], []])
    with pytest.raises(ConfigError, match="phrase_scores"):
        ContextGraph([[1]], phrase_scores=[1.0, 2.0])


@pytest.mark.parametrize("seed", range(6))
def test_biased_wide_beam_equals_exhaustive_enumeration_plus_bonus(reference_path, seed):
    g = torch.Generator().manual_seed(300 + seed)
    frames, vocab = 5, 4
    phrases = [[1, 2], [2, 3, 1], [3]]
    graph = ContextGraph(phrases, score=0.7)
    log_probs = random_log_probs(g, 1, frames, vocab)
    exact = exhaustive_label_posteriors(log_probs[0], bonus=lambda labels: occurrences_bonus(labels, phrases, 0.7))
    nbest = ctc_prefix_beam_search(log_probs, [frames], beam_size=3000, context=graph)[0]
    assert {tuple(h.tokens): pytest.approx(h.score, abs=1e-9) for h in nbest} == exact
    scores = [h.score for h in nbest]
    assert scores == sorted(scores, reverse=True)


def test_a_hotword_wins_over_a_slightly_better_competitor(reference_path):
    # frames favour "1 3" slightly over "1 2"; biasing "1 2" flips the ranking
    probs = torch.tensor([[0.05, 0.9, 0.02, 0.03], [0.9, 0.04, 0.03, 0.03], [0.05, 0.02, 0.43, 0.5]])
    log_probs = probs.log()[None]
    plain = ctc_prefix_beam_search(log_probs, [3], beam_size=4)[0]
    assert plain[0].tokens == [1, 3]
    biased = ctc_prefix_beam_search(log_probs, [3], beam_size=4, context=ContextGraph([[1, 2]], score=1.0))[0]
    assert biased[0].tokens == [1, 2]
    plain_score = {tuple(h.tokens): h.score for h in plain}
    assert biased[0].score == pytest.approx(plain_score[(1, 2)] + 2.0)
