"""Process allocator settings for inference on glibc Linux.

glibc's malloc serves a block above its mmap threshold with a fresh ``mmap`` and unmaps it on
``free``, and returns free memory at the top of the heap to the kernel once it exceeds the trim
threshold.  A model forward allocates and frees activations of several megabytes per op, so with
the defaults every call faults its activations in again page by page (minor faults, kernel time).
:func:`tune_allocator` raises both thresholds once per process, at engine construction, so freed
activation blocks stay in the heap and are reused by the next call.

The setting is process-wide and opt-in: it applies only with ``OASR_MALLOC_TUNING=1`` (or ``true`` /
``yes`` / ``on``), on glibc Linux, and when ``GLIBC_TUNABLES`` sets no ``glibc.malloc.*`` tunable (the
user's explicit choice wins).  Off by default because it measured neutral: it halves the minor faults of a
WeNet-sized batch, but the fp32 ratio to onnxruntime stayed within the box's noise (docs/benchmarks.md
§ WeNet, "Page faults"), while the freed blocks it keeps raise the peak RSS growth of the 20-minute
memory test from ~60 to ~92 MB (bound 103 MB).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform
import sys
import threading

logger = logging.getLogger("oasr.engine")

#: the environment variable that turns the tuning on
ENV_VAR = "OASR_MALLOC_TUNING"

# mallopt parameter numbers (glibc <malloc.h>)
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3

_MIB = 1024 * 1024

#: mallopt parameter -> value applied.  32 MiB is the largest mmap threshold glibc accepts on 64-bit
#: (larger values are refused); the trim threshold keeps up to 128 MiB of freed memory at the top
#: of the heap; the top pad grows the heap in 16 MiB steps (pages are only resident once touched).
SETTINGS: dict[int, int] = {
    M_MMAP_THRESHOLD: 32 * _MIB,
    M_TRIM_THRESHOLD: 128 * _MIB,
    M_TOP_PAD: 16 * _MIB,
}

_NAMES = {M_MMAP_THRESHOLD: "M_MMAP_THRESHOLD", M_TRIM_THRESHOLD: "M_TRIM_THRESHOLD", M_TOP_PAD: "M_TOP_PAD"}

_lock = threading.Lock()
_applied: dict[str, int] | None = None


def is_glibc_linux() -> bool:
    return sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


def enabled() -> bool:
    """Whether the environment asks for the tuning (``OASR_MALLOC_TUNING`` truthy, no
    ``glibc.malloc.*`` in ``GLIBC_TUNABLES``)."""
    if os.environ.get(ENV_VAR, "0").strip().lower() not in ("1", "true", "yes", "on"):
        return False
    return "glibc.malloc." not in os.environ.get("GLIBC_TUNABLES", "")


def _mallopt():
    """libc's ``mallopt(int param, int value) -> int`` (1 on success)."""
    fn = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    fn.argtypes = [ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def tune_allocator() -> dict[str, int]:
    """Apply :data:`SETTINGS` with ``mallopt`` once per process; returns the settings in effect
    (name -> bytes), empty when skipped.  A value glibc refuses is logged and left out."""
    global _applied
    with _lock:
        if _applied is not None:
            return dict(_applied)
        if not (is_glibc_linux() and enabled()):
            return {}
        try:
            mallopt = _mallopt()
        except (OSError, AttributeError) as exc:  # a libc without mallopt
            logger.debug("malloc tuning skipped: %s", exc)
            return {}
        applied: dict[str, int] = {}
        for param, value in SETTINGS.items():
            if mallopt(param, value) == 1:
                applied[_NAMES[param]] = value
            else:
                logger.warning("mallopt(%s, %d) was refused; left at glibc's default", _NAMES[param], value)
        _applied = applied
        logger.debug("malloc tuning applied: %s", applied)
        return dict(applied)
