"""Tokenizers: turn model token ids into text, for every checkpoint family.

Kinds are registered through the ``oasr_register_tokenizers`` hook (core registers ``symbol_table``,
``sentencepiece``, ``huggingface``, ``whisper`` and ``funasr_char``); :func:`build_tokenizer` builds
the one a checkpoint's :class:`~oasr.models.TokenizerSpec` names.  The contract is in
:mod:`oasr.tokenizers.base`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from oasr.tokenizers.base import IncrementalDecoder, Tokenizer, TokenizerError


def build_tokenizer(spec: Any, root: Path | str | None = None) -> Tokenizer:
    """The tokenizer ``spec.kind`` names, built from ``spec.files`` (relative names under ``root``)."""
    from oasr import plugins
    from oasr.errors import UnknownComponentError

    registry = plugins.registry("tokenizers")
    if spec.kind not in registry:
        raise UnknownComponentError(
            f"tokenizer kind {spec.kind!r} is not registered; registered kinds: "
            f"{', '.join(registry.names()) or '(none)'}{plugins.failed_plugins_hint()}",
            name=spec.kind,
        )
    cls = registry.get(spec.kind).load()
    return cls.from_spec(spec, Path(root) if root is not None else None)


__all__ = ["IncrementalDecoder", "Tokenizer", "TokenizerError", "build_tokenizer"]
