"""Hostile and unusual clients: decoded-size limits, slow uploads, abandoned work, shutdown, realtime abuse.

Every network connection is to 127.0.0.1; every loop and wait is bounded.
"""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from oasr import audio
from oasr.errors import AudioError
from tests.serve.harness import tinyctc_engine


def _silence_flac(path, rate: int, channels: int, seconds: int):
    block = np.zeros((rate, channels), dtype=np.int16)
    with sf.SoundFile(path, "w", samplerate=rate, channels=channels, format="FLAC", subtype="PCM_16") as f:
        for _ in range(seconds):
            f.write(block)
    return path.read_bytes()


def test_the_engine_limit_refuses_a_bomb_before_decoding_it(ckpt_dir, tmp_path, monkeypatch):
    """--max-audio-seconds 30 holds from the container's metadata: not one sample of 8 × 96 kHz is decoded."""
    engine = tinyctc_engine(ckpt_dir, max_audio_seconds=30)
    bomb = _silence_flac(tmp_path / "bomb.flac", 96000, 8, 40)
    monkeypatch.setattr(audio._Decoded, "add", lambda *a: pytest.fail("decoded a sample"))
    with pytest.raises(AudioError, match=r"40 s long, over the limit of 30 s \(EngineConfig.max_audio_seconds"):
        engine.add_request(bomb)
