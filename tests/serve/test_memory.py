"""Admission by memory for full-attention encoders (oasr.engine.memory), on the WeNet fixture model."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from oasr.engine import Engine, EngineConfig
from oasr.engine.memory import ATTENTION_COPIES
from oasr.errors import RequestError
from tests.helpers import REPO

WENET = REPO.parent / "shared" / "fixtures" / "wenet_u2pp" / "model"

_MEASURE = """
import sys, torch
torch.set_num_threads(1)
from oasr.checkpoints.loading import load_pretrained

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

model = load_pretrained(sys.argv[1]).model
frames = int(sys.argv[2])
feats = torch.randn(1, frames * 4 + 6, 80)
with torch.inference_mode():
    model.encode_offline(feats[:, :406], torch.tensor([406]))  # warm up: allocator, kernels
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak RSS (VmHWM) to the current RSS
    base = status("VmRSS")
    out, _ = model.encode_offline(feats, torch.tensor([feats.shape[1]]))
assert out.shape[1] == frames, out.shape
print(status("VmHWM") - base)
"""


@pytest.fixture(scope="module")
def wenet_engine() -> Engine:
    return Engine(EngineConfig(model=str(WENET)))


def _measured(frames: int, kernels: str) -> int:
    done = subprocess.run([sys.executable, "-c", _MEASURE, str(WENET), str(frames)], capture_output=True,
                          text=True, timeout=300, check=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "OASR_KERNELS": kernels})
    return int(done.stdout.split()[-1])


def test_the_estimate_bounds_a_measured_forward_at_two_lengths(wenet_engine):
    """Peak RSS growth of a full-attention forward at 1500 and 3000 encoder frames (quadratic in the
    frames; the kernel's peak-RSS mark is reset just before the forward).  The estimate is an upper bound
    of every path and at most twice the reference path's measurement (``OASR_KERNELS=0``: torch's
    attention, the path every device has); the CPU fast path (WeNet's in-place attention core over packed
    GEMMs) needs less and stays under it."""
    memory = wenet_engine.forward_memory
    assert memory.heads == 4 and memory.itemsize == 4 and memory.frames_per_second == pytest.approx(25.0)
    for frames in (1500, 3000):
        estimate = memory.estimate(frames)
        reference, fast = _measured(frames, "0"), _measured(frames, "1")
        assert reference <= estimate <= 2 * reference, (frames, reference, estimate)
        assert fast <= estimate, (frames, fast, estimate)


def test_twenty_minutes_on_a_24_gb_machine_is_refused_naming_the_limit_and_the_way_out(monkeypatch):
    """~30,000 encoder frames of full attention (it peaked at ~23 GB RSS): refused at admission."""
    monkeypatch.setenv("OASR_MAX_FORWARD_BYTES", str(12 * 2**30))  # half of a 24 GB machine
    engine = Engine(EngineConfig(model=str(WENET)))
    with pytest.raises(RequestError) as err:
        engine.add_request(np.zeros(20 * 60 * 16000, np.float32), sample_rate=16000, request_id="long")
    message = str(err.value)
    assert "30001 encoder frames" in message and "limit of 12.0 GiB (OASR_MAX_FORWARD_BYTES)" in message
    longest = engine.forward_memory.max_seconds()
    assert f"pieces of at most {longest:.0f} s" in message and 600 < longest < 1200
    assert err.value.param == "file" and not engine.has_unfinished_requests()
    engine.add_request(np.zeros(int(longest * 0.9) * 16000, np.float32), sample_rate=16000)  # fits: admitted
    assert engine.has_unfinished_requests()


def test_the_scheduler_keeps_rows_apart_when_their_batch_would_not_fit(monkeypatch):
    one_row = ATTENTION_COPIES * 4 * 2501**2 * 4  # the estimate of one 100 s row: 4 heads, 2501 frames, fp32
    monkeypatch.setenv("OASR_MAX_FORWARD_BYTES", str(int(1.5 * one_row)))
    engine = Engine(EngineConfig(model=str(WENET), max_batch_size=4))
    for i in range(2):
        engine.add_request(np.zeros(100 * 16000, np.float32), sample_rate=16000, request_id=f"r{i}")
    first = engine.scheduler.schedule(flush=True)
    assert [r.request_id for r in first] == ["r0"]
    assert engine.forward_memory.fits_batch(2, 100) and not engine.forward_memory.fits_batch(2, 10000)


def test_a_bad_limit_in_the_environment_is_a_config_error(monkeypatch):
    from oasr.engine.memory import forward_limit_bytes
    from oasr.errors import ConfigError

    monkeypatch.setenv("OASR_MAX_FORWARD_BYTES", "lots")
    with pytest.raises(ConfigError, match="OASR_MAX_FORWARD_BYTES must be a positive number of bytes, got 'lots'"):
        forward_limit_bytes("cpu")
    monkeypatch.setenv("OASR_MAX_FORWARD_BYTES", "8e9")
    assert forward_limit_bytes("cpu") == (8 * 10**9, "OASR_MAX_FORWARD_BYTES")
