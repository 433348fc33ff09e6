"""Fixtures of the WeNet family tests: the U2++ reference directory made by WeNet's own code."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import oasr

CLIPS = ("clip0", "clip1")
#: reference decode runs: (fixture prefix, decoding chunk size, left chunks)
RUNS = (("offline", -1, -1), ("chunk4_left-1", 4, -1), ("chunk4_left2", 4, 2))


@pytest.fixture(scope="session")
def wenet_dir(fixtures_dir) -> Path:
    path = fixtures_dir / "wenet_u2pp"
    if not (path / "model" / "train.yaml").is_file():
        pytest.fail(f"WeNet reference fixture missing at {path}")
    return path


@pytest.fixture(scope="session")
def model_dir(wenet_dir) -> Path:
    return wenet_dir / "model"


@pytest.fixture(scope="session")
def refs(wenet_dir) -> dict[str, dict[str, torch.Tensor]]:
    return {clip: load_file(str(wenet_dir / "ref" / f"{clip}.safetensors")) for clip in CLIPS}


@pytest.fixture(scope="session")
def results(wenet_dir) -> dict:
    return json.loads((wenet_dir / "ref" / "results.json").read_text())


@pytest.fixture(scope="session")
def loaded(model_dir):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = oasr.load_pretrained(model_dir)
    about_load = [str(w.message) for w in caught if str(model_dir) in str(w.message)]
    assert about_load == [], about_load  # a clean load: no drop or capability warning
    return loaded


@pytest.fixture(scope="session")
def model(loaded):
    return loaded.model


@pytest.fixture
def wenet_copy(model_dir, tmp_path) -> Path:
    """A writable copy of the release directory (for yaml / file variants)."""
    dst = tmp_path / "wenet"
    shutil.copytree(model_dir, dst)
    for path in dst.iterdir():
        path.chmod(0o644)
    return dst
