"""Helpers for the decoding tests: the reference path switch and brute-force CTC posteriors."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from oasr.layers._backend import clear_kernel_cache
from tests.tokenizers.conftest import whisper_multilingual_json  # noqa: F401  (a shared fixture)


@pytest.fixture
def reference_path(monkeypatch):
    """Force oasr.decoding.ctc onto its reference (pure Python) code."""
    monkeypatch.setenv("OASR_KERNELS", "0")
    clear_kernel_cache()
    yield
    clear_kernel_cache()


def random_log_probs(generator: torch.Generator, batch: int, frames: int, vocab: int, scale: float = 2.0) -> torch.Tensor:
    return (torch.randn(batch, frames, vocab, generator=generator) * scale).log_softmax(-1)


def exhaustive_label_posteriors(log_probs: torch.Tensor, blank: int = 0, forced_blank=frozenset(),
                                bonus=None) -> dict[tuple[int, ...], float]:
    """log P(label sequence) for every label sequence, by enumerating every frame-level path.

    ``forced_blank``: frames whose only allowed label is blank.  ``bonus(labels)``: added to a
    sequence's log posterior.
    """
    frames, vocab = log_probs.shape
    lp = log_probs.double().tolist()
    per_seq: dict[tuple[int, ...], list[float]] = {}
    choices = [[blank] if t in forced_blank else range(vocab) for t in range(frames)]
    for path in itertools.product(*choices):
        labels = tuple(u for i, u in enumerate(path) if u != blank and (i == 0 or path[i - 1] != u))
        per_seq.setdefault(labels, []).append(sum(lp[t][u] for t, u in enumerate(path)))
    out = {}
    for labels, scores in per_seq.items():
        m = max(scores)
        out[labels] = m + math.log(math.fsum(math.exp(s - m) for s in scores))
        if bonus is not None:
            out[labels] += bonus(labels)
    return out
