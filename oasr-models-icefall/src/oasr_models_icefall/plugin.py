"""Hook implementations of oasr-models-icefall (registers by string; imports no model code)."""

from __future__ import annotations

from oasr.hookspecs import hookimpl


@hookimpl
def oasr_register_models(register) -> None:
    """Nothing registered yet."""
