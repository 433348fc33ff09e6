"""What a model must implement to serve each decode family.

:data:`CAPABILITIES` is the answer to "what must a model implement to support family X": for each
decode family, the dotted model members it requires and why.  A decode strategy calls
:func:`require_capability` once, at engine construction, so a checkpoint advertising a family it
cannot serve fails there, naming what is missing, instead of on its first request.
"""

from __future__ import annotations

from typing import Any

import attrs

from oasr.errors import CapabilityError
from oasr.models.base import BaseAsrModel, BaseEncoder, resolve_member


@attrs.frozen
class Capability:
    requires: tuple[str, ...]
    why: str


CAPABILITIES: dict[str, Capability] = {
    "ctc": Capability(
        ("forward_offline",),
        "CTC search reads per-frame log-probs (B, T', V) and their lengths from forward_offline",
    ),
    "ctc_aed_rescoring": Capability(
        ("forward_offline", "encode_offline", "ctc_log_probs", "decoder.rescore"),
        "the CTC prefix-beam n-best is rescored by one teacher-forced attention-decoder pass over the encoder output",
    ),
    "aed": Capability(
        ("encode_offline", "decoder.prefill", "decoder.step", "decoder.select", "decoder.merge"),
        "label-synchronous decoding drives the batched incremental decoder surface over the encoder output",
    ),
    "transducer": Capability(
        ("encode_offline", "predictor.init_state", "predictor.predict", "predictor.advance", "joiner"),
        "frame-synchronous search runs the prediction network and joiner over each encoder frame",
    ),
    "paraformer": Capability(
        ("encode_offline", "predictor", "decoder"),
        "non-autoregressive decoding fires CIF tokens from the predictor and decodes them in one pass",
    ),
    "sensevoice": Capability(
        ("encode_offline", "queries", "ctc_log_probs"),
        "query embeddings (language, event, emotion, text norm) are prepended to the features and the CTC head "
        "emits the tags before the transcript",
    ),
    "llm": Capability(
        ("encode_offline", "language_model.prefill", "language_model.step", "language_model.select"),
        "the audio embeddings are prefixed to a causal language model decoded incrementally",
    ),
}

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


def missing_members(model: Any, family: str) -> tuple[str, ...]:
    cap = CAPABILITIES[family]
    missing = []
    for dotted in cap.requires:
        try:
            resolve_member(model, dotted)
        except AttributeError:
            missing.append(dotted)
            continue
        if _is_stub(model, dotted):
            missing.append(dotted)
    return tuple(missing)


def require_capability(model: Any, family: str) -> None:
    """Raise :class:`CapabilityError` unless ``model`` can serve decode family ``family``."""
    if family not in CAPABILITIES:
        raise CapabilityError(
            f"unknown decode family {family!r}; known: {', '.join(sorted(CAPABILITIES))}", capability=family
        )
    name = type(model).__name__
    declared = getattr(model, "capabilities", frozenset())
    if family not in declared:
        raise CapabilityError(
            f"{name} does not serve decode family {family!r}; this checkpoint serves: "
            f"{', '.join(sorted(declared)) or '(nothing)'}",
            capability=family,
        )
    missing = missing_members(model, family)
    if missing:
        raise CapabilityError(
            f"{name} declares decode family {family!r} but lacks {', '.join(missing)} "
            f"({CAPABILITIES[family].why})",
            capability=family,
            missing=missing,
        )
