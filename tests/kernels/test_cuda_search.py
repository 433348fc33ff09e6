"""The CUDA search kernels under the numba CUDA simulator against their CPU references.

CTC greedy is compared with core's :func:`oasr.decoding.ctc.ctc_greedy_search`; the transducer kernel
with :func:`oasr_kernels.cuda.transducer.reference_greedy_search`, which is itself checked here
against a one-utterance-at-a-time loop written out in the test.
"""

from __future__ import annotations

import pytest
import torch

from oasr.decoding.ctc import ctc_greedy_search
from oasr.errors import ConfigError
from oasr_kernels.cuda import ctc as cuda_ctc
from oasr_kernels.cuda import transducer as cuda_transducer


def peaky_log_probs(batch: int, frames: int, vocab: int, seed: int) -> torch.Tensor:
    """Log-probs with runs of repeated labels and blanks, as trained CTC models give."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, frames, vocab, generator=g)
    runs = torch.randint(0, vocab, (batch, frames // 3 + 1), generator=g).repeat_interleave(3, dim=1)[:, :frames]
    logits.scatter_add_(2, runs[..., None], torch.full((batch, frames, 1), 4.0))
    return logits.log_softmax(-1)


def assert_same_hypotheses(got, want, *, confidences: bool = True) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.tokens == w.tokens
        assert g.token_frames == w.token_frames
        if confidences:
            assert g.token_confidences == pytest.approx(w.token_confidences, rel=1e-6)
            assert g.score == pytest.approx(w.score, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("seed", range(3))
def test_ctc_greedy_matches_core(seed):
    log_probs = peaky_log_probs(5, 23, 7, seed)
    lengths = torch.tensor([23, 0, 1, 17, 9])
    want = ctc_greedy_search(log_probs, lengths, blank=0)
    got = cuda_ctc.ctc_greedy_search(log_probs, lengths, blank=0)
    assert any(len(h.tokens) > 2 for h in want)  # the case exercises merging, not only empty outputs
    assert_same_hypotheses(got, want)


def test_ctc_greedy_with_a_nonzero_blank():
    log_probs = peaky_log_probs(3, 15, 6, 11)
    lengths = torch.tensor([15, 12, 4])
    assert_same_hypotheses(cuda_ctc.ctc_greedy_search(log_probs, lengths, blank=5),
                           ctc_greedy_search(log_probs, lengths, blank=5))


def test_ctc_greedy_refuses_bad_arguments_as_core_does():
    log_probs = peaky_log_probs(2, 5, 4, 0)
    with pytest.raises(ConfigError, match="lengths"):
        cuda_ctc.ctc_greedy_search(log_probs, torch.tensor([6, 1]))
    with pytest.raises(ConfigError, match="blank"):
        cuda_ctc.ctc_greedy_search(log_probs, torch.tensor([5, 1]), blank=4)


class TableStep:
    """A stateless predictor of context one over fixed tables: logits = acoustic[b, t] + language[last].

    The logits of a row do not depend on the rest of the batch, so every search sees identical numbers."""

    def __init__(self, acoustic: torch.Tensor, language: torch.Tensor, blank: int, rows: list[int] | None = None):
        self.acoustic, self.language = acoustic, language
        self.rows = torch.arange(acoustic.shape[0]) if rows is None else torch.tensor(rows)
        self.last = torch.full((self.rows.numel(),), blank, dtype=torch.long)
        self.calls = 0

    def logits(self, frames: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.acoustic[self.rows, frames.cpu()] + self.language[self.last]

    def emit(self, tokens: torch.Tensor, mask: torch.Tensor) -> None:
        self.last = torch.where(mask.cpu(), tokens.cpu(), self.last)


def tables(batch: int, frames: int, vocab: int, seed: int, blank: int = 0):
    g = torch.Generator().manual_seed(seed)
    acoustic = torch.randn(batch, frames, vocab, generator=g)
    acoustic[..., blank] += 0.8  # blanks are frequent, as in a trained model
    language = torch.randn(vocab, vocab, generator=g)
    return acoustic, language


def one_at_a_time(acoustic, language, lengths, blank, max_symbols):
    """The greedy rule written out for one utterance at a time."""
    out = []
    for b, n in enumerate(lengths):
        last, t, sym, row = blank, 0, 0, []
        while t < n:
            u = int((acoustic[b, t] + language[last]).argmax())
            if u != blank:
                row.append((u, t))
                last, sym = u, sym + 1
                if sym >= max_symbols:
                    t, sym = t + 1, 0
            else:
                t, sym = t + 1, 0
        out.append(row)
    return out


@pytest.mark.parametrize("max_symbols", [1, 3])
def test_reference_transducer_search_is_the_greedy_rule(max_symbols):
    acoustic, language = tables(4, 12, 9, seed=max_symbols)
    lengths = [12, 5, 0, 9]
    hyps = cuda_transducer.reference_greedy_search(TableStep(acoustic, language, 0), torch.tensor(lengths),
                                                   max_symbols=max_symbols)
    want = one_at_a_time(acoustic, language, lengths, 0, max_symbols)
    assert [list(zip(h.tokens, h.token_frames, strict=True)) for h in hyps] == want
    if max_symbols > 1:
        assert any(len(set(h.token_frames)) < len(h.token_frames) for h in hyps)  # several symbols on a frame


@pytest.mark.parametrize(("max_symbols", "blank", "seed"), [(1, 0, 0), (2, 0, 1), (3, 4, 2)])
def test_transducer_kernel_matches_reference(max_symbols, blank, seed):
    acoustic, language = tables(4, 8, 7, seed, blank)
    lengths = torch.tensor([8, 3, 0, 6])
    want = cuda_transducer.reference_greedy_search(TableStep(acoustic, language, blank), lengths, blank=blank,
                                                   max_symbols=max_symbols)
    got = cuda_transducer.transducer_greedy_search(TableStep(acoustic, language, blank), lengths, blank=blank,
                                                   max_symbols=max_symbols)
    assert sum(len(h.tokens) for h in want) > 5
    assert_same_hypotheses(got, want, confidences=False)


def test_transducer_kernel_breaks_ties_towards_the_lower_id():
    acoustic = torch.zeros(1, 3, 6)
    acoustic[0, :, 2] = acoustic[0, :, 4] = 5.0  # labels 2 and 4 tie on every frame
    language = torch.zeros(6, 6)
    got = cuda_transducer.transducer_greedy_search(TableStep(acoustic, language, 0), torch.tensor([3]))
    assert got[0].tokens == [2, 2, 2]
