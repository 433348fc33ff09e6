"""Shared test fixtures."""

from __future__ import annotations

import os
from pathlib import Path

# No test may reach a model hub, however the suite is started (scripts/test.sh sets these too): a missing
# asset must fail, not fetch.  Set before anything imports huggingface_hub.
for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ[_var] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("OASR_SHARED", REPO.parent / "shared"))
FIXTURES = SHARED / "fixtures"

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    if not FIXTURES.is_dir():
        pytest.fail(f"reference fixtures not found at {FIXTURES} (expected ../shared/fixtures beside the repo)")
    return FIXTURES


@pytest.fixture
def row_kernel_calls(monkeypatch):
    """The (rows, weight shape, int8?) of each call the ``row_linear`` kernel (oasr-kernels) ran."""
    from oasr.layers import _backend

    calls: list[tuple[int, tuple[int, ...], bool]] = []
    real = _backend.kernel("row_linear")
    assert real is not None, "oasr-kernels registers row_linear"

    def spy(x, weight, bias=None, residual=None, scale=None, steps=None):
        calls.append((x.shape[0], tuple(weight.shape), scale is not None))
        return real(x, weight, bias, residual, scale, steps)

    monkeypatch.setitem(_backend._cache, "row_linear", spy)
    return calls


@pytest.fixture
def fused_step_calls(monkeypatch):
    """The row count of each call the ``decoder_layer_rows`` kernel (oasr-kernels: one decoder layer per call) ran."""
    from oasr.layers import _backend

    calls: list[int] = []
    real = _backend.kernel("decoder_layer_rows")
    assert real is not None, "oasr-kernels registers decoder_layer_rows"

    class Spy:
        prepare = staticmethod(real.prepare)

        def __call__(self, x, *args):
            calls.append(x.shape[0])
            return real(x, *args)

    monkeypatch.setitem(_backend._cache, "decoder_layer_rows", Spy())
    return calls
