"""Kernel tests: the CUDA kernels run under numba's CUDA simulator unless a GPU run is asked for.

``OASR_GPU_TESTS=1`` (set by ``scripts/gpu-check.sh``) runs the tests marked ``gpu`` on the real
device and leaves the simulator off; otherwise ``NUMBA_ENABLE_CUDASIM=1`` is set here, before any
kernel module imports ``numba.cuda``, and the ``gpu`` tests are skipped with the reason given.  A GPU
run selects ``-m gpu`` (the simulator tests need the simulator: they hand the kernels CPU tensors).
"""

from __future__ import annotations

import os

import pytest

GPU_RUN = os.environ.get("OASR_GPU_TESTS", "0") not in ("", "0")
if not GPU_RUN:
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device; run by scripts/gpu-check.sh (OASR_GPU_TESTS=1)")


def pytest_collection_modifyitems(config, items) -> None:
    if GPU_RUN:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: run scripts/gpu-check.sh on a GPU machine")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)
