"""The engine's device and dtype: what ``EngineConfig.device`` / ``dtype`` may ask on this machine.

- ``device``: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"`` (CUDA when torch sees a GPU, else the
  CPU).  Asking for CUDA where torch has no CUDA build or sees no GPU is refused at construction with
  a :class:`~oasr.errors.ConfigError` that says which of the two it is.
- ``dtype``: ``None`` keeps the checkpoint's own dtype; ``float32`` everywhere; ``float16`` and
  ``bfloat16`` only on a GPU — on these CPUs bfloat16 is emulated (about 5x slower than float32) and
  float16 matmuls are slower still, so a CPU engine refuses them (``quantization="int8"`` is the fast
  CPU option).
"""

from __future__ import annotations

import torch

from oasr.errors import ConfigError

GPU_ONLY_DTYPES = (torch.float16, torch.bfloat16)


def resolve_device(device: str) -> torch.device:
    """The torch device for ``EngineConfig.device`` (see the module docstring)."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise ConfigError(f"EngineConfig.device {device!r} is not a device; expected 'cpu', 'cuda', 'cuda:N' or "
                          f"'auto'", key="device") from None
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            why = ("this torch build has no CUDA support" if torch.version.cuda is None
                   else f"torch (CUDA {torch.version.cuda}) sees no GPU: check the driver and CUDA_VISIBLE_DEVICES")
            raise ConfigError(f"EngineConfig.device={device!r} asks for a GPU, but {why} (torch {torch.__version__}); "
                              f"use device='cpu' or 'auto'", key="device")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise ConfigError(f"EngineConfig.device={device!r}: only {torch.cuda.device_count()} CUDA device(s) are "
                              f"visible", key="device")
    elif parsed.type != "cpu":
        raise ConfigError(f"EngineConfig.device={device!r}: the engine runs on 'cpu' or 'cuda', not {parsed.type!r}",
                          key="device")
    return parsed


def check_dtype(dtype: str | None, device: torch.device) -> torch.dtype | None:
    """The compute dtype ``EngineConfig.dtype`` names, refused where ``device`` cannot run it well."""
    from oasr.checkpoints.loaded import parse_dtype

    try:
        parsed = parse_dtype(dtype)
    except ValueError as exc:
        raise ConfigError(f"EngineConfig.dtype: {exc}", key="dtype") from None
    if parsed in GPU_ONLY_DTYPES and device.type == "cpu":
        raise ConfigError(f"EngineConfig.dtype={dtype!r} is a GPU option: on the CPU it is emulated and several times "
                          f"slower than float32; use dtype=None or 'float32' (or quantization='int8') on the CPU, "
                          f"or device='cuda'", key="dtype")
    return parsed


def engine_device(device: str, dtype: str | None) -> tuple[torch.device, torch.dtype | None]:
    """Both checks, as the engine runs them before loading anything."""
    resolved = resolve_device(device)
    return resolved, check_dtype(dtype, resolved)
