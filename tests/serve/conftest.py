"""Fixtures for the server tests (helpers in :mod:`tests.serve.harness`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import soundfile as sf

from oasr.engine import Engine
from tests.serve.harness import API_KEY, SAMPLE, ServerThread, serving, tinyctc_engine, wav_bytes


@pytest.fixture(scope="session")
def ckpt_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tinyctc") / "ckpt"


@pytest.fixture(scope="module")
def server(ckpt_dir) -> Iterator[ServerThread]:
    """The main test server: API key, 1 MiB upload limit, 4 requests in flight."""
    engine = tinyctc_engine(ckpt_dir, max_batch_size=8)
    with serving(engine, api_key=API_KEY, max_upload_bytes=2**20, max_concurrency=4) as srv:
        yield srv


@pytest.fixture(scope="module")
def reference(ckpt_dir) -> Engine:
    """A separate engine on the same checkpoint, for in-process expected outputs."""
    return tinyctc_engine(ckpt_dir, max_batch_size=1)


@pytest.fixture(scope="session")
def speech() -> bytes:
    """The first 3 s of the repository's espeak sample as a 16 kHz PCM16 WAV."""
    samples, rate = sf.read(SAMPLE, dtype="int16")
    return wav_bytes(samples[: 3 * rate], rate)


