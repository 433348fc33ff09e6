"""Tensors derived from a module's parameters (a prepacked or transposed weight copy, a folded batch norm),
kept beside the module and rebuilt when a source tensor changes.

``derived(owner, name, sources, build)`` returns ``build()``'s value, computed once and then reused while every
tensor in ``sources`` is unchanged.  What the cache guarantees:

* **rebuilt on any change of a source**: its storage (the cache holds a weak reference to each source's
  storage, so a new storage allocated at a freed one's address is not taken for it), its offset in the storage
  (``data_ptr``), its dtype, or its version counter, which every in-place edit bumps (``load_state_dict``'s
  copy included).  A parameter replaced or moved (``.to()``, ``load_state_dict(assign=True)``) has a new
  storage; the storage also fixes the device.  ``extra`` adds key parts compared with ``==`` (a scale, a
  shape), and a change of them rebuilds too.
* **not rebuilt otherwise**: one ``build()`` per version of the sources, however many calls.
* **one value per (owner, name)**: modules sharing a weight each keep their own copy, and an edit of the shared
  weight rebuilds each of them on its next call.  The values live in the owner's ``__dict__`` (one dict
  lookup per call) and go with it.
* **inference data**: ``build()`` runs under ``no_grad`` and outside inference mode, so the tensors it makes
  are ordinary tensors with version counters (a derived value may be a source of another).  Under autograd
  (grad enabled and a source requiring grad) or while tracing, ``build()`` runs in the call with grad as it
  is and nothing is cached: gradients reach the sources and a trace records the ops.  A value no gradient
  can pass through anyway (an int8 pack for fbgemm) says ``differentiable=False`` and is kept under
  autograd too (not while tracing).

Nothing derived is a parameter or a buffer: ``state_dict`` never sees it, and a ``deepcopy`` or an unpickled
copy of the owner starts with none (it rebuilds its own).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

import torch

T = TypeVar("T")

#: the owner's ``__dict__`` entry holding its values
_SLOT = "_oasr_derived"
#: every owner that has held a value (for :func:`owners` and :func:`forget`)
_owners: weakref.WeakSet = weakref.WeakSet()


class _Slots(dict):
    """An owner's values, name → (key, weak references to the sources' storages, value); neither copied nor
    pickled with the owner (the copy's sources are other tensors: it rebuilds)."""

    def __reduce__(self):
        return _Slots, ()

    def __deepcopy__(self, memo):
        return _Slots()


def _storages(sources: Sequence[torch.Tensor | None]) -> tuple:
    return tuple(None if t is None else weakref.ref(t.untyped_storage()) for t in sources)


def derived(owner: object, name: Hashable, sources: Sequence[torch.Tensor | None], build: Callable[[], T], *,
            extra: Hashable = (), differentiable: bool = True) -> T:
    """``build()``, kept on ``owner`` under ``name`` and rebuilt when a tensor of ``sources`` (None entries are
    skipped) or ``extra`` changes; see the module docstring for the guarantees."""
    if (differentiable and torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in sources)) \
            or torch._C._get_tracing_state() is not None:
        return build()
    key = [None if t is None else (t.data_ptr(), t._version, t.dtype) for t in sources]
    key.append(extra)
    slots = owner.__dict__.get(_SLOT)
    if slots is None:
        slots = owner.__dict__[_SLOT] = _Slots()
        _owners.add(owner)
    hit = slots.get(name)
    if hit is not None and hit[0] == key:
        for ref in hit[1]:
            if ref is not None and ref() is None:
                break  # a source's storage was freed: this address now holds another
        else:
            return hit[2]
    with torch.inference_mode(False), torch.no_grad():
        value = build()
    slots[name] = (key, _storages(sources), value)
    return value


class SameValues:
    """An ``extra`` key part matching a tensor by its values: equal to another when they hold the same tensor or
    equal ones (a table recomputed per call keys like the one the value was built from).  Holds the tensor."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SameValues) and (other.tensor is self.tensor or (
            other.tensor.shape == self.tensor.shape and other.tensor.dtype == self.tensor.dtype
            and other.tensor.device == self.tensor.device and torch.equal(other.tensor, self.tensor)))

    def __hash__(self) -> int:
        return hash((tuple(self.tensor.shape), self.tensor.dtype))


def row_major(owner: object, *weights: torch.Tensor, name: Hashable = "row_major") -> torch.Tensor:
    """``cat(weights, 1).t()`` contiguous, kept like :func:`derived`: a (in, out) copy of a (out, in) weight
    (or of weights side by side along their inputs) for ``x @ w`` / ``addmm`` at a few rows, where a
    row-major operand streams better than the transposed view (a second copy of the weights in memory)."""
    return derived(owner, name, weights,
                   lambda: (weights[0] if len(weights) == 1 else torch.cat(weights, 1)).t().contiguous())


def kept(owner: object) -> tuple[Hashable, ...]:
    """The names of the values kept on ``owner`` (which derived paths it has taken)."""
    return tuple(owner.__dict__.get(_SLOT, ()))


def owners() -> list[object]:
    """Every owner with a value kept (which derived paths a run has taken, for tests and diagnostics)."""
    return [owner for owner in list(_owners) if owner.__dict__.get(_SLOT)]


def forget(owner: object | None = None) -> None:
    """Drop the values kept on ``owner`` (every owner's when None); the next call rebuilds them."""
    for each in list(_owners) if owner is None else [owner]:
        each.__dict__.pop(_SLOT, None)


__all__ = ["SameValues", "derived", "forget", "kept", "owners", "row_major"]
