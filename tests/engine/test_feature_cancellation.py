"""An aborted request leaves feature extraction at the next tile of the spectral front-end (issue 22: the
work after an abandoned long upload that is not a module call).  The abort happens from inside the
extraction, after a few tiles, so the test reads how many tiles ran, not how long anything took."""

from __future__ import annotations

import numpy as np
import pytest

from oasr.cancellation import cancellable, check_cancelled
from oasr.engine import Engine, EngineConfig
from oasr.features import spectral
from tests.serve.harness import tinyctc_engine

LONG_SECONDS = 600
ABORT_AFTER_TILES = 3


def _count_tiles(monkeypatch, on_tile):
    """Wrap the per-tile log step of ``stft_mel``; ``on_tile(n)`` runs after tile ``n`` (1-based)."""
    calls = {"n": 0}
    original = spectral._apply_log

    def counted(*args, **kwargs):
        calls["n"] += 1
        on_tile(calls["n"])
        return original(*args, **kwargs)

    monkeypatch.setattr(spectral, "_apply_log", counted)
    return calls


def _abort_during_features(engine: Engine, monkeypatch, audio: np.ndarray):
    request_id = "long"
    outputs = []
    calls = _count_tiles(monkeypatch, lambda n: engine.abort_request(request_id) if n == ABORT_AFTER_TILES else None)
    engine.add_request(audio, request_id=request_id, callback=outputs.append)
    engine.run()
    return calls["n"], outputs


def test_an_aborted_request_stops_the_fbank_front_end_at_the_next_tile(tmp_path, monkeypatch):
    engine = tinyctc_engine(tmp_path / "ckpt", max_batch_size=1)
    rng = np.random.default_rng(0)
    audio = (0.05 * rng.standard_normal(16000 * LONG_SECONDS)).astype(np.float32)
    total_tiles = -(-(100 * LONG_SECONDS) // spectral.TILE_FRAMES)
    assert total_tiles > 10 * ABORT_AFTER_TILES
    tiles, outputs = _abort_during_features(engine, monkeypatch, audio)
    assert tiles == ABORT_AFTER_TILES, f"{tiles} of {total_tiles} tiles ran after the abort"
    assert [o.finish_reason for o in outputs] == ["abort"]
    monkeypatch.undo()
    # the engine serves the next request as usual
    assert isinstance(engine.transcribe(audio[:32000]), str)


def test_an_aborted_whisper_request_stops_its_log_mel_at_the_next_tile(monkeypatch):
    engine = Engine(EngineConfig())
    audio = np.zeros(16000 * LONG_SECONDS, np.float32)
    tiles, outputs = _abort_during_features(engine, monkeypatch, audio)
    assert tiles == ABORT_AFTER_TILES
    assert [o.finish_reason for o in outputs] == ["abort"]


def test_the_check_is_scoped_to_its_block_and_thread():
    import threading

    check_cancelled()  # outside any block: nothing to check

    def stop() -> None:
        raise RuntimeError("cancelled")

    seen = []
    with cancellable(stop):
        with pytest.raises(RuntimeError, match="cancelled"):
            check_cancelled()
        thread = threading.Thread(target=lambda: seen.append(check_cancelled()))
        thread.start()
        thread.join()
    assert seen == [None]  # another thread does not see this thread's check
    check_cancelled()
