"""Search algorithms and result types shared by the decode strategies."""

from __future__ import annotations

import importlib
from typing import Any

from oasr.decoding.types import Hypothesis, Segment, WordTiming

# search code is imported on first use (it pulls in torch and the kernel seam)
_LAZY = {
    "ContextGraph": "oasr.decoding.context",
    "CtcPrefixBeamState": "oasr.decoding.ctc",
    "ctc_greedy_search": "oasr.decoding.ctc",
    "ctc_prefix_beam_search": "oasr.decoding.ctc",
    "ctc_token_confidences": "oasr.decoding.words",
    "words_from_tokens": "oasr.decoding.words",
}

__all__ = ["Hypothesis", "Segment", "WordTiming", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'oasr.decoding' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
