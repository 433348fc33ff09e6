"""oasr-kernels' numba prefix beam search: registered, selected, and identical to the reference."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

# oasr-kernels is part of the workspace install: a missing one fails here rather than skipping
import oasr_kernels.ctc as oasr_kernels_ctc
from oasr import plugins
from oasr.decoding.context import ContextGraph
from oasr.decoding.ctc import (
    CtcPrefixBeamState,
    ReferencePrefixBeam,
    ctc_prefix_beam_search,
    hypotheses,
    skip_log_threshold,
)
from oasr.layers._backend import clear_kernel_cache, kernel
from tests.decoding.conftest import exhaustive_label_posteriors, random_log_probs
from tests.decoding.test_ctc import WENET_CASES, check_against_wenet


@pytest.fixture(autouse=True)
def kernels_on(monkeypatch):
    monkeypatch.delenv("OASR_KERNELS", raising=False)
    clear_kernel_cache()
    yield
    clear_kernel_cache()


def reference_search(log_probs, lengths, beam_size, n_best=None, blank=0, blank_skip_threshold=None, context=None):
    out = []
    for row in range(log_probs.shape[0]):
        search = ReferencePrefixBeam(beam_size, blank, skip_log_threshold(blank_skip_threshold), context)
        search.advance(log_probs[row, :int(lengths[row])])
        out.append(hypotheses(search.nbest(n_best or beam_size)))
    return out


def assert_same(kernel_out, reference_out):
    assert len(kernel_out) == len(reference_out)
    for k_row, r_row in zip(kernel_out, reference_out, strict=True):
        assert [h.tokens for h in k_row] == [h.tokens for h in r_row]
        assert [h.token_frames for h in k_row] == [h.token_frames for h in r_row]
        for a, b in zip(k_row, r_row, strict=True):
            assert math.isclose(a.score, b.score, rel_tol=1e-12, abs_tol=1e-12)
            assert a.token_confidences == pytest.approx(b.token_confidences, rel=1e-12)


def test_kernels_are_registered_and_selected(monkeypatch):
    registry = plugins.registry("kernels")
    for slot in ("ctc_prefix_beam_search", "ctc_prefix_beam_state"):
        assert slot in registry and registry.get(slot).distribution == "oasr-kernels"
    assert kernel("ctc_prefix_beam_search") is oasr_kernels_ctc.ctc_prefix_beam_search
    assert isinstance(CtcPrefixBeamState()._search, oasr_kernels_ctc.PrefixBeamState)
    monkeypatch.setenv("OASR_KERNELS", "0")
    clear_kernel_cache()
    assert kernel("ctc_prefix_beam_search") is None
    assert isinstance(CtcPrefixBeamState()._search, ReferencePrefixBeam)


@pytest.mark.parametrize(("clip", "mode"), WENET_CASES)
def test_kernel_equals_wenet_fixture(fixtures_dir, clip, mode):
    check_against_wenet(fixtures_dir, clip, mode,
                        lambda lp: ctc_prefix_beam_search(lp, [lp.shape[1]], beam_size=10)[0])


@st.composite
def search_cases(draw):
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    batch, frames, vocab = draw(st.integers(1, 3)), draw(st.integers(0, 30)), draw(st.integers(2, 12))
    log_probs = random_log_probs(g, batch, frames, vocab, scale=draw(st.sampled_from([0.5, 2.0, 6.0])))
    if draw(st.booleans()):  # exact ties between labels and between prefixes
        log_probs = (log_probs * 2).round() / 2
        log_probs = log_probs - log_probs.logsumexp(-1, keepdim=True)
    lengths = [draw(st.integers(0, frames)) for _ in range(batch)]
    context = None
    if draw(st.booleans()):
        phrases = draw(st.lists(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=3), min_size=1, max_size=4))
        context = ContextGraph(phrases, score=draw(st.sampled_from([0.5, 2.0])))
    return dict(log_probs=log_probs, lengths=lengths, beam_size=draw(st.integers(1, 12)),
                n_best=draw(st.none() | st.integers(1, 12)), blank=draw(st.integers(0, vocab - 1)),
                blank_skip_threshold=draw(st.none() | st.sampled_from([0.0, 0.3, 0.9])), context=context)


@settings(max_examples=400, deadline=None)
@given(case=search_cases())
def test_kernel_equals_reference_on_random_batches(case):
    assert_same(ctc_prefix_beam_search(**case), reference_search(**case))


@pytest.mark.parametrize("seed", range(6))
def test_kernel_equals_reference_with_large_vocabularies(seed):
    # large vocabularies take the kernel's blocked top-k path; coarse rounding makes many exact ties,
    # also between the k-th label and labels in other blocks
    g = torch.Generator().manual_seed(1000 + seed)
    vocab = (700, 1000, 4099, 5003, 64 * 12, 6000)[seed]
    log_probs = random_log_probs(g, 2, 40, vocab, scale=4.0)
    if seed % 2:
        log_probs = log_probs.round()
        log_probs = log_probs - log_probs.logsumexp(-1, keepdim=True)
    for beam in (1, 4, 10):
        case = dict(log_probs=log_probs, lengths=[40, 23], beam_size=beam, blank=seed)
        assert_same(ctc_prefix_beam_search(**case), reference_search(**case))


@pytest.mark.parametrize("seed", range(8))
def test_kernel_wide_beam_equals_exhaustive_enumeration(seed):
    g = torch.Generator().manual_seed(seed)
    frames, vocab = 1 + seed % 6, 2 + seed % 3
    log_probs = random_log_probs(g, 1, frames, vocab)
    exact = exhaustive_label_posteriors(log_probs[0], blank=seed % vocab)
    nbest = ctc_prefix_beam_search(log_probs, [frames], beam_size=2000, blank=seed % vocab)[0]
    assert {tuple(h.tokens): pytest.approx(h.score, abs=1e-9) for h in nbest} == exact


def test_long_stream_in_small_chunks_compacts_and_equals_offline():
    g = torch.Generator().manual_seed(5)
    log_probs = random_log_probs(g, 1, 3000, 20, scale=3.0)
    context = ContextGraph([[3, 4], [5, 6, 7]], score=1.0)
    expected = reference_search(log_probs, [3000], beam_size=4, context=context)[0]
    state = CtcPrefixBeamState(beam_size=4, context=context)
    impl = state._search
    capacity, nodes = [], []
    for start in range(0, 3000, 13):
        state.advance(log_probs[0, start:start + 13])
        capacity.append(impl.ti.shape[0])
        nodes.append(int(impl.counts[0]))
    assert_same([state.results()], [expected])
    # unreachable nodes were dropped along the way (the node count fell), so the trie stayed below the
    # 1 + 4 × 3000 nodes that keeping every surviving prefix would take
    assert any(b < a for a, b in zip(nodes, nodes[1:], strict=False))
    assert max(capacity) < 1 + 4 * 3000
