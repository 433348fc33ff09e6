"""The backend seam between the reference (torch) implementations and registered kernels.

``oasr-kernels`` (or any plugin) registers accelerated implementations through the
``oasr_register_kernels`` hook under a slot name; :func:`kernel` returns the registered one or
``None``, and callers fall back to their reference path.  ``OASR_KERNELS=0`` forces the reference.
A kernel must produce the reference's results (tests compare the two).

Device variants: ``kernel(name, device)`` with a non-CPU device looks up the slot ``name@<device
type>`` (``stft_mel@cuda``), the variant that works on that device's tensors in place; a caller
without one falls back to its CPU path.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

_cache: dict[str, Callable[..., Any] | None] = {}


def kernels_enabled() -> bool:
    return os.environ.get("OASR_KERNELS", "1").strip().lower() not in ("0", "false", "no", "off")


def kernel(name: str, device: Any = None) -> Callable[..., Any] | None:
    """The registered kernel for slot ``name`` (on ``device``'s kind when that is not the CPU), or None."""
    if not kernels_enabled():
        return None
    kind = getattr(device, "type", None) or (str(device).split(":")[0] if device is not None else "cpu")
    if kind != "cpu":
        name = f"{name}@{kind}"
    if name in _cache:
        return _cache[name]
    from oasr import plugins

    registry = plugins.registry("kernels")
    fn = None
    if name in registry:
        entry = registry.get(name)
        try:
            fn = entry.load()
        except Exception as exc:  # a kernel that fails to import must not break the reference path
            warnings.warn(f"kernel {name!r} from {entry.distribution!r} failed to load ({exc}); "
                          f"using the reference implementation", RuntimeWarning, stacklevel=2)
    _cache[name] = fn
    return fn


def clear_kernel_cache() -> None:
    _cache.clear()
