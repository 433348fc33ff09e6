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
