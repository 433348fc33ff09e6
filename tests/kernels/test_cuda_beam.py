"""``ctc_prefix_beam_search@cuda`` (one block per utterance) under the numba CUDA simulator.

Compared with core's reference search (pure Python, ``OASR_KERNELS=0`` semantics) on random batches —
tokens, float64 scores, emission frames and confidences — and with WeNet's recorded outputs.
"""

from __future__ import annotations

import pytest
import torch

from oasr.decoding.context import ContextGraph
from oasr.decoding.ctc import ReferencePrefixBeam, hypotheses, skip_log_threshold
from oasr_kernels.cuda import beam as cuda_beam
from tests.decoding.conftest import random_log_probs
from tests.decoding.test_ctc import WENET_CASES, check_against_wenet


def reference(log_probs, lengths, beam_size, n_best=None, blank=0, blank_skip_threshold=None, context=None):
    out = []
    for row in range(log_probs.shape[0]):
        search = ReferencePrefixBeam(beam_size, blank, skip_log_threshold(blank_skip_threshold), context)
        search.advance(log_probs[row, :int(lengths[row])])
        out.append(hypotheses(search.nbest(n_best or beam_size)))
    return out


def assert_same(got, want) -> None:
    assert len(got) == len(want)
    for g_row, w_row in zip(got, want, strict=True):
        assert [h.tokens for h in g_row] == [h.tokens for h in w_row]
        assert [h.score for h in g_row] == [h.score for h in w_row]
        assert [h.token_frames for h in g_row] == [h.token_frames for h in w_row]
        for g, w in zip(g_row, w_row, strict=True):
            assert g.token_confidences == pytest.approx(w.token_confidences, rel=1e-12)


@pytest.mark.parametrize(("beam", "vocab", "blank", "seed"), [(4, 6, 0, 0), (3, 9, 2, 1), (8, 5, 0, 2), (1, 7, 0, 3)])
def test_matches_the_reference_search(beam, vocab, blank, seed):
    g = torch.Generator().manual_seed(seed)
    log_probs = random_log_probs(g, 3, 14, vocab)
    lengths = torch.tensor([14, 9, 0])
    want = reference(log_probs, lengths, beam, blank=blank)
    got = cuda_beam.ctc_prefix_beam_search(log_probs, lengths, beam_size=beam, blank=blank)
    assert any(len(row) > 1 for row in want) or beam == 1
    assert_same(got, want)


def test_n_best_and_blank_skipping():
    g = torch.Generator().manual_seed(5)
    log_probs = random_log_probs(g, 2, 12, 6, scale=3.0)
    lengths = torch.tensor([12, 10])
    want = reference(log_probs, lengths, 5, n_best=2, blank_skip_threshold=0.3)
    got = cuda_beam.ctc_prefix_beam_search(log_probs, lengths, beam_size=5, n_best=2, blank_skip_threshold=0.3)
    assert all(len(row) == 2 for row in got)
    assert_same(got, want)


def test_equal_log_probs_keep_the_reference_tie_order():
    log_probs = torch.full((1, 6, 5), -1.6094379)  # every label ties on every frame
    want = reference(log_probs, [6], 4)
    assert_same(cuda_beam.ctc_prefix_beam_search(log_probs, torch.tensor([6]), beam_size=4), want)


def test_hotwords_are_served_by_the_host_kernel():
    g = torch.Generator().manual_seed(6)
    log_probs = random_log_probs(g, 1, 10, 6)
    context = ContextGraph([[2, 3]], score=2.0)
    want = reference(log_probs, [10], 4, context=context)
    assert_same(cuda_beam.ctc_prefix_beam_search(log_probs, torch.tensor([10]), beam_size=4, context=context), want)


@pytest.mark.parametrize(("clip", "mode"), WENET_CASES[:1])  # one clip: each simulated frame is slow
def test_matches_wenet(fixtures_dir, clip, mode):
    check_against_wenet(fixtures_dir, clip, mode,
                        lambda lp: cuda_beam.ctc_prefix_beam_search(lp, torch.tensor([lp.shape[1]]), beam_size=10)[0])
