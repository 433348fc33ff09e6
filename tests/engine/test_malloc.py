"""The engine's glibc malloc tuning (oasr.engine.malloc): the mallopt calls, the opt-outs, the real effect."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from oasr.engine import malloc


class FakeLibc:
    def __init__(self, refuse: tuple[int, ...] = ()):
        self.calls: list[tuple[int, int]] = []
        self.refuse = refuse

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return 0 if param in self.refuse else 1


@pytest.fixture
def fake(monkeypatch):
    libc = FakeLibc()
    monkeypatch.setattr(malloc, "_applied", None)
    monkeypatch.setattr(malloc, "_mallopt", lambda: libc.mallopt)
    monkeypatch.setattr(malloc, "is_glibc_linux", lambda: True)
    monkeypatch.setenv(malloc.ENV_VAR, "1")
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    return libc


def test_mallopt_called_with_the_settings_once_per_process(fake):
    applied = malloc.tune_allocator()
    assert fake.calls == [(malloc.M_MMAP_THRESHOLD, 32 << 20), (malloc.M_TRIM_THRESHOLD, 128 << 20),
                          (malloc.M_TOP_PAD, 16 << 20)]
    assert applied == {"M_MMAP_THRESHOLD": 32 << 20, "M_TRIM_THRESHOLD": 128 << 20, "M_TOP_PAD": 16 << 20}
    assert malloc.tune_allocator() == applied
    assert len(fake.calls) == 3  # the second call applies nothing again


@pytest.mark.parametrize("value", [None, "0", "false", "off", "No"])
def test_off_unless_asked(fake, monkeypatch, value):
    if value is None:
        monkeypatch.delenv(malloc.ENV_VAR)
    else:
        monkeypatch.setenv(malloc.ENV_VAR, value)
    assert malloc.tune_allocator() == {}
    assert fake.calls == []


@pytest.mark.parametrize("value", ["1", "true", "ON"])
def test_env_var_truthy_turns_it_on(fake, monkeypatch, value):
    monkeypatch.setenv(malloc.ENV_VAR, value)
    assert len(malloc.tune_allocator()) == 3


def test_user_glibc_tunables_win(fake, monkeypatch):
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1000000")
    assert malloc.tune_allocator() == {}
    assert fake.calls == []


def test_off_glibc_nothing_is_called(fake, monkeypatch):
    monkeypatch.setattr(malloc, "is_glibc_linux", lambda: False)
    assert malloc.tune_allocator() == {}
    assert fake.calls == []


def test_a_refused_value_is_left_out(fake):
    fake.refuse = (malloc.M_TOP_PAD,)
    assert malloc.tune_allocator() == {"M_MMAP_THRESHOLD": 32 << 20, "M_TRIM_THRESHOLD": 128 << 20}


def test_engine_construction_applies_it(tinyctc_dir, monkeypatch):
    from oasr.engine import Engine, EngineConfig
    from oasr.engine import engine as engine_module

    calls = []
    monkeypatch.setattr(engine_module, "tune_allocator", lambda: calls.append(1) or {})
    Engine(EngineConfig(model=str(tinyctc_dir)))
    assert calls == [1]


# Three 20 MiB blocks allocated, touched and freed, five times over.  With glibc's defaults the first
# free raises the mmap threshold to 20 MiB and the trim threshold to 40 MiB, so the blocks come from
# the heap and the 60 MiB freed at its top is returned to the kernel: every round faults ~15k pages in
# again.  With the tuning the freed blocks stay in the heap and the rounds reuse them.
_CHILD = r"""
import ctypes, json, resource
from oasr.engine.malloc import tune_allocator
applied = tune_allocator()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
def rounds(n):
    for _ in range(n):
        blocks = [libc.malloc(20 << 20) for _ in range(3)]
        for b in blocks:
            ctypes.memset(b, 1, 20 << 20)
        for b in blocks:
            libc.free(b)
rounds(2)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
rounds(5)
print(json.dumps({"applied": applied, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""


def _child(env_value: str) -> dict:
    import os

    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    env[malloc.ENV_VAR] = env_value
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not malloc.is_glibc_linux(), reason="mallopt tuning applies to glibc Linux only")
def test_real_glibc_keeps_freed_blocks_in_the_heap():
    tuned, default = _child("1"), _child("0")
    assert tuned["applied"] == {"M_MMAP_THRESHOLD": 32 << 20, "M_TRIM_THRESHOLD": 128 << 20, "M_TOP_PAD": 16 << 20}
    assert default["applied"] == {}
    pages = 5 * 3 * (20 << 20) // 4096
    assert default["faults"] > pages // 2, default  # the defaults fault the blocks in every round
    assert tuned["faults"] < pages // 20, tuned
