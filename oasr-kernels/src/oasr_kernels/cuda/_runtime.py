"""How the CUDA kernels see tensors, launch, and run under the numba CUDA simulator.

``NUMBA_ENABLE_CUDASIM=1`` selects numba's simulator, which runs every kernel thread as a Python
thread over host arrays: it is how CI (no GPU) checks the kernels.  numba reads the variable when it
is imported; :func:`cuda` re-reads numba's configuration first, so setting the variable any time
before the first kernel call is enough (as long as nothing imported ``numba.cuda`` earlier).

A kernel argument is a *view* of a torch tensor: on a GPU ``numba.cuda.as_cuda_array`` over the
tensor's ``__cuda_array_interface__``; under the simulator a numpy view of a CPU tensor.  Neither
copies.  Launches go to torch's current CUDA stream, so kernels order with torch's own work.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch

#: threads per block on a GPU, and under the simulator (each simulated thread is a Python thread)
GPU_THREADS = 128
SIM_THREADS = 4
#: shared-memory scratch per block: room for :data:`GPU_THREADS` partial results
MAX_THREADS = GPU_THREADS


def simulated() -> bool:
    """True when kernels run under the numba CUDA simulator."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0").strip() not in ("", "0")


def cuda() -> Any:
    """The ``numba.cuda`` module, in simulator mode when ``NUMBA_ENABLE_CUDASIM`` asks for it."""
    from numba.core import config

    if bool(config.ENABLE_CUDASIM) != simulated():
        if "numba.cuda" in sys.modules:
            raise RuntimeError(f"NUMBA_ENABLE_CUDASIM={os.environ.get('NUMBA_ENABLE_CUDASIM')!r} was set after "
                               f"numba.cuda was imported (as {'the simulator' if config.ENABLE_CUDASIM else 'the GPU target'});"
                               f" set it before anything imports numba.cuda")
        config.reload_config()
    from numba import cuda as numba_cuda

    return numba_cuda


def threads(work: int, *, sim_cap: int = SIM_THREADS) -> int:
    """A power-of-two block size for ``work`` items per block (at most ``sim_cap`` under the simulator)."""
    cap = min(sim_cap, SIM_THREADS) if simulated() else GPU_THREADS
    n = 1
    while n < cap and n < work:
        n *= 2
    return n


def kernel_device(tensor: torch.Tensor) -> None:
    """Refuse a tensor the kernels cannot read: a GPU one needs CUDA, the simulator host memory."""
    if simulated():
        if tensor.device.type != "cpu":
            raise ValueError(f"under the numba CUDA simulator the kernels take CPU tensors, got {tensor.device}")
    elif tensor.device.type != "cuda":
        raise ValueError(f"CUDA kernels take CUDA tensors, got one on {tensor.device}")


def view(tensor: torch.Tensor) -> Any:
    """A kernel argument over ``tensor``'s memory (contiguous tensors only; no copy)."""
    if not tensor.is_contiguous():
        raise ValueError(f"kernel arguments must be contiguous, got strides {tensor.stride()}")
    tensor = tensor.detach()
    if simulated():
        return tensor.numpy()
    return cuda().as_cuda_array(tensor, sync=False)


def launch(kernel: Any, blocks: int, block_threads: int, *args: Any) -> None:
    """Run ``kernel`` over ``blocks`` blocks of ``block_threads`` threads on torch's current stream."""
    if blocks <= 0:
        return
    if simulated():
        kernel[blocks, block_threads](*args)
        return
    stream = cuda().external_stream(torch.cuda.current_stream().cuda_stream)
    kernel[blocks, block_threads, stream](*args)


def jit(**kwargs: Any):
    """``numba.cuda.jit`` resolved at first use (importing a kernel module needs no GPU)."""
    return cuda().jit(**kwargs)
