"""A tiny CTC checkpoint (the example plugin's architecture) registered in-process for engine tests."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import ensure_tinyctc_importable, tinyctc_registered, toyfamily_registered

ensure_tinyctc_importable()


@pytest.fixture(scope="session")
def tinyctc_dir(tmp_path_factory):
    from oasr_tinyctc.convert import write_checkpoint

    with tinyctc_registered():
        # seed 5: every frame of the 50 test inputs leads by > 100x the batching noise (see test_offline)
        yield write_checkpoint(tmp_path_factory.mktemp("tinyctc") / "ckpt", seed=5)


def synth(seconds: float, seed: int, sr: int = 16000) -> np.ndarray:
    """Non-stationary test audio: a chirp with amplitude modulation, pulses and noise bursts."""
    rng = np.random.default_rng(seed)
    n = int(seconds * sr)
    t = np.arange(n) / sr
    f0, f1 = rng.uniform(100, 400), rng.uniform(800, 3000)
    phase = 2 * np.pi * (f0 * t + (f1 - f0) * t ** 2 / (2 * max(seconds, 1e-3)))
    x = 0.3 * np.sin(phase) * (0.6 + 0.4 * np.sin(2 * np.pi * rng.uniform(1, 5) * t))
    pulses = (np.sin(2 * np.pi * rng.uniform(2, 8) * t) > 0.95).astype(np.float64)
    x += 0.2 * pulses * rng.standard_normal(n)
    x += 0.01 * rng.standard_normal(n)
    return np.clip(x, -1, 1).astype(np.float32)


@pytest.fixture(scope="module")
def toy_dirs(tmp_path_factory):
    """The example family's toyframe checkpoints, one per streaming kind (slot, stateful)."""
    with toyfamily_registered():
        from oasr_toyfamily.convert import write_checkpoint
        from oasr_toyfamily.model import ToyFrameConfig

        root = tmp_path_factory.mktemp("toyframe")
        yield {kind: write_checkpoint(root / kind, ToyFrameConfig(streaming_kind=kind), seed=3)
               for kind in ("slot", "stateful")}
