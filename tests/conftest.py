"""Shared test fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("OASR_SHARED", REPO.parent / "shared"))
FIXTURES = SHARED / "fixtures"

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    if not FIXTURES.is_dir():
        pytest.fail(f"reference fixtures not found at {FIXTURES} (expected ../shared/fixtures beside the repo)")
    return FIXTURES
