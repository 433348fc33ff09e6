"""Comparison helpers of the WeNet family tests."""

from __future__ import annotations

import torch


def assert_rel(actual: torch.Tensor, expected: torch.Tensor, tol: float = 1e-4) -> None:
    """max |actual - expected| within ``tol`` of max |expected| (shapes equal)."""
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    err = (actual.double() - expected.double()).abs().max().item()
    scale = expected.double().abs().max().item()
    assert err <= tol * scale, f"max abs error {err:.3g} > {tol} x {scale:.3g}"


def encode_ref(model, fbank: torch.Tensor, chunk: int, left: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The encoder output the fixture decoded for a run (the masked chunk forward for chunked runs)."""
    with torch.no_grad():
        return model.encoder(fbank[None], torch.tensor([fbank.size(0)]), chunk_size=chunk, num_left_chunks=left)
