"""Fixtures of the icefall family tests: release directories and references made by icefall's own code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

CLIPS = ("clip0", "clip1")
#: the icefall reference fixtures in ../shared/fixtures
ZIPFORMER = ("zipformer_ctc", "zipformer_ctc_causal", "zipformer_transducer", "zipformer_transducer_causal")
CAUSAL = ("zipformer_ctc_causal", "zipformer_transducer_causal")
TRANSDUCERS = ("zipformer_transducer", "zipformer_transducer_causal")


def release_dir(fixtures_dir: Path, name: str) -> Path:
    """An icefall release directory of the fixtures (fails the test when it is absent)."""
    path = fixtures_dir / name
    if not (path / "exp" / "pretrained.pt").is_file():
        pytest.fail(f"icefall reference fixture missing at {path}")
    return path


def refs(fixtures_dir: Path, name: str) -> dict[str, dict[str, torch.Tensor]]:
    """The reference tensors of each clip of fixture ``name``."""
    root = release_dir(fixtures_dir, name) / "ref"
    return {clip: load_file(str(root / f"{clip}.safetensors")) for clip in CLIPS}


def results(fixtures_dir: Path, name: str) -> dict:
    return json.loads((release_dir(fixtures_dir, name) / "ref" / "results.json").read_text())


def clip_path(fixtures_dir: Path, clip: str) -> Path:
    return fixtures_dir / "audio" / f"{clip}.wav"
