"""The one check that Ray is installed (imported by every module of :mod:`oasr.ray`)."""

from __future__ import annotations

from typing import Any


def require_ray(*parts: str) -> Any:
    """Import and return ``ray`` (and check ``ray.<part>`` imports), or raise one clear error."""
    import importlib

    from oasr.errors import ConfigError

    try:
        ray = importlib.import_module("ray")
        for part in parts:
            importlib.import_module(f"ray.{part}")
    except ImportError as exc:
        raise ConfigError(f"Ray is not installed ({exc.name or exc}): pip install \"oasr-core[ray]\"",
                          key="ray") from None
    return ray
