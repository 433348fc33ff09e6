"""What a decode strategy needs from a model, and the check that the model has it.

A decode strategy declares :class:`Requirement` s (a dotted model member plus why it needs it); the
engine checks them once, when it builds the strategy, so a checkpoint advertising a decode method it
cannot serve fails there, naming every missing member and the reason, instead of on its first
request.  There is no table of families here: the strategy that reads a member is the one that
declares it, so a new decode family brings its own contract.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs

from oasr.errors import CapabilityError
from oasr.models.base import BaseAsrModel, BaseEncoder, resolve_member


@attrs.frozen
class Requirement:
    """A model member a strategy reads (``"decoder.prefill"``) and why it reads it."""

    member: str
    why: str


# Members the base classes define only as NotImplementedError stubs: finding one of these on a model
# means the subclass did not implement it.
_STUB_OWNERS = (BaseAsrModel, BaseEncoder)


def _is_stub(model: Any, dotted: str) -> bool:
    owner_path, _, member = dotted.rpartition(".")
    owner = resolve_member(model, owner_path) if owner_path else model
    for cls in type(owner).__mro__:
        if member in vars(cls):
            return cls in _STUB_OWNERS
    return False


def missing_members(model: Any, requires: Iterable[Requirement]) -> tuple[Requirement, ...]:
    """The requirements ``model`` does not meet (absent, None, or a base-class stub)."""
    missing = []
    for req in requires:
        try:
            resolve_member(model, req.member)
        except AttributeError:
            missing.append(req)
            continue
        if _is_stub(model, req.member):
            missing.append(req)
    return tuple(missing)


def check_requirements(model: Any, requires: Iterable[Requirement], *, method: str, what: str = "decode") -> None:
    """Raise :class:`CapabilityError` naming every member of ``requires`` that ``model`` lacks."""
    missing = missing_members(model, requires)
    if missing:
        detail = "; ".join(f"{r.member} ({r.why})" for r in missing)
        raise CapabilityError(
            f"{type(model).__name__} cannot {what} with decode method {method!r}: it lacks {detail}",
            capability=method,
            missing=tuple(r.member for r in missing),
        )
