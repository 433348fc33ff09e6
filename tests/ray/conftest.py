"""A local Ray cluster for the Ray tests: started here, loopback only, two CPUs, shut down at the end."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf


@pytest.fixture(scope="session")
def ray_cluster():
    try:
        import ray
    except ImportError:
        pytest.fail('Ray is not installed: pip install "oasr-core[ray]" (scripts/test.sh installs it)')
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1",
             configure_logging=False)
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture(scope="session")
def wenet_model(fixtures_dir):
    return fixtures_dir / "wenet_u2pp" / "model"


@pytest.fixture(scope="session")
def corpus(fixtures_dir, tmp_path_factory):
    """42 different clips in a small tree: pieces of the fixture audio at different offsets and gains."""
    root = tmp_path_factory.mktemp("corpus")
    clips = [sf.read(fixtures_dir / "audio" / f"clip{i}.wav", dtype="float32")[0] for i in (0, 1)]
    rng = np.random.default_rng(3)
    for i in range(42):
        audio = clips[i % 2]
        start = int(rng.integers(0, audio.size // 3))
        length = int(rng.integers(audio.size // 2, audio.size - start))
        piece = (audio[start:start + length] * rng.uniform(0.5, 1.5)).clip(-1, 1)
        path = root / ("ab"[i % 2]) / f"clip{i:02d}.wav"
        path.parent.mkdir(exist_ok=True)
        sf.write(path, piece, 16000, subtype="PCM_16")
    return root
