"""``"module:attr.path"`` targets: how registrations name code that is imported on first use."""

from __future__ import annotations

import importlib
from typing import Any


def import_target(target: Any) -> Any:
    """Resolve a ``"module:attr.path"`` string to the object; anything else is returned as is."""
    if not isinstance(target, str):
        return target
    module_name, sep, attr_path = target.partition(":")
    if not sep or not module_name or not attr_path:
        raise ValueError(f"expected a 'module:attribute' string, got {target!r}")
    obj: Any = importlib.import_module(module_name)
    for part in attr_path.split("."):
        obj = getattr(obj, part)
    return obj
