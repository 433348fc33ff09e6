"""Hook implementations of oasr-kernels (registers by string; numba is imported on first use)."""

from __future__ import annotations

from oasr.hookspecs import hookimpl


@hookimpl
def oasr_register_kernels(register) -> None:
    """Nothing registered yet."""
