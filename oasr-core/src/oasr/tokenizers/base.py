"""The tokenizer contract every kind implements, and the incremental decoder for streaming partials.

A tokenizer turns model token ids into text (and, where the kind supports it, text into ids):

``vocab_size``
    the number of ids the tokenizer knows (ids in ``[0, vocab_size)``).
``special_ids``
    ids never shown in text (blank, sos/eos, unk, control and timestamp tokens ...).  The checkpoint's
    :class:`~oasr.models.TokenizerSpec` may add ids past ``vocab_size`` (a CTC blank appended after the
    pieces); those are accepted and dropped like any other special.
``decode(ids)``
    the text of the non-special ids.  Byte-level vocabularies can produce byte sequences that are not
    valid UTF-8 (a model that stops half-way through a character); such bytes are dropped, so text
    never contains U+FFFD from broken bytes.  On valid sequences this equals the reference library's
    decoding.
``encode(text)``
    ids for text, where the kind can do it; otherwise :class:`TokenizerError`.
``id_to_piece(id)``
    the vocabulary entry of one id, as stored (``"▁the"``, ``"Ġthe"``, ``"<|en|>"``).
``token_pieces(ids)``
    one display string per id, in order, with ``"".join(pieces) == decode(ids)``: the text each token
    contributes.  A token that completes a multi-byte character carries the character; the tokens
    before it carry ``""``.  Word timings are built on this (:mod:`oasr.decoding.words`).
``incremental_decoder()``
    an :class:`IncrementalDecoder`: ``push(ids)`` returns the text that became final, ``flush()`` the
    rest (and resets it for a new text).  For every prefix of ids, however it is split into pushes, the pushed outputs plus
    ``flush()`` concatenate to ``decode(prefix)``, and no output ever contains U+FFFD or half a
    character.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from oasr.errors import CheckpointFormatError, OasrError

REPLACEMENT = "\ufffd"


class TokenizerError(OasrError, ValueError):
    """An id outside the vocabulary, text a tokenizer cannot encode, or an unusable tokenizer file."""

    def __init__(self, message: str, *, token_id: int | None = None):
        super().__init__(message)
        self.token_id = token_id


def drop_replacement(text: str) -> str:
    """Text without the U+FFFD characters a lossy UTF-8 decode put in place of broken bytes."""
    return text.replace(REPLACEMENT, "") if REPLACEMENT in text else text


def resolve_file(spec: Any, root: Path | str | None, roles: Sequence[str], *, required: bool = True) -> Path | None:
    """The path of the first of ``roles`` present in ``spec.files``.

    Relative names are resolved against ``root``; absolute names are used as they are.  With
    ``required`` and none of the roles present, a spec naming exactly one file uses that one.
    """
    files = dict(spec.files)
    name = next((files[role] for role in roles if role in files), None)
    if name is None and required and len(files) == 1:
        name = next(iter(files.values()))
    if name is None:
        if not required:
            return None
        raise CheckpointFormatError(
            f"{spec.kind} tokenizer spec names no file for role {' or '.join(repr(r) for r in roles)}; "
            f"it has: {', '.join(f'{k}={v!r}' for k, v in files.items()) or '(no files)'}"
        )
    path = Path(name)
    if not path.is_absolute():
        path = Path(root if root is not None else ".") / path
    if not path.is_file():
        raise CheckpointFormatError(f"{spec.kind} tokenizer file {path} does not exist", path=path)
    return path


class Tokenizer:
    """Base class of the tokenizer kinds (see the module docstring for the contract)."""

    #: the registry name of the kind
    kind: ClassVar[str] = ""

    def __init__(self, *, vocab_size: int, special_ids: Iterable[int] = ()):
        self._vocab_size = int(vocab_size)
        self._special_ids = frozenset(int(i) for i in special_ids)

    # -- the contract ----------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def special_ids(self) -> frozenset[int]:
        return self._special_ids

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids``; specials are skipped, undecodable bytes dropped."""
        return drop_replacement(self._decode_raw(self.text_ids(ids)))

    def encode(self, text: str) -> list[int]:
        raise TokenizerError(f"the {self.kind} tokenizer cannot encode text (it has no encoder for {text!r})")

    def id_to_piece(self, token_id: int) -> str:
        raise NotImplementedError

    def token_pieces(self, ids: Sequence[int]) -> list[str]:
        """One display string per id; they concatenate to ``decode(ids)``."""
        decoder = self.incremental_decoder()
        pieces = [decoder.push([token_id]) for token_id in ids]
        tail = decoder.flush()
        if tail:
            # text still pending at the end (an incomplete character) belongs to the last token with text
            last = max((i for i, t in enumerate(ids) if int(t) not in self._special_ids), default=len(ids) - 1)
            if last >= 0:
                pieces[last] += tail
        return pieces

    def incremental_decoder(self) -> IncrementalDecoder:
        return IncrementalDecoder(self)

    # -- what a kind implements ------------------------------------------------------------------------
    def _decode_raw(self, ids: list[int]) -> str:
        """Text of non-special, in-range ids; may contain U+FFFD where bytes are incomplete or invalid."""
        raise NotImplementedError

    # -- helpers ---------------------------------------------------------------------------------------
    def text_ids(self, ids: Iterable[int]) -> list[int]:
        """``ids`` without the specials, each checked to lie in the vocabulary."""
        out: list[int] = []
        specials = self._special_ids
        vocab = self._vocab_size
        for token_id in ids:
            token_id = int(token_id)
            if token_id in specials:
                continue
            if not 0 <= token_id < vocab:
                raise TokenizerError(
                    f"token id {token_id} is outside the {self.kind} vocabulary of {vocab} ids "
                    f"(and is not one of the tokenizer's special ids)",
                    token_id=token_id,
                )
            out.append(token_id)
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self._vocab_size}, specials={len(self._special_ids)})"


class IncrementalDecoder:
    """Streaming detokenization: emit text only once later tokens can no longer change it.

    The decoder keeps a small window of ids: ``[prefix, read)`` is the part already emitted whose text
    the next decode is compared against, ``[read, end)`` the new ids.  The window starts at a chunk
    that produced more than whitespace.  New text is the decode of the
    whole window minus the decode of its emitted part, which keeps kind-specific joining rules (the
    first piece's dropped leading space, byte-level merges) right without decoding everything again.
    Text is released only when the window's raw decode does not end in an incomplete character, so
    the boundary the window moves to is always a character boundary.  If a tokenizer's decoding ever
    fails to extend what was already emitted, the decoder falls back to decoding everything.
    """

    def __init__(self, tokenizer: Tokenizer):
        self._tok = tokenizer
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0
        self._emitted: list[str] = []

    @property
    def ids(self) -> list[int]:
        """The non-special ids pushed so far."""
        return list(self._ids)

    def push(self, ids: Iterable[int]) -> str:
        """Add ids; return the text that became final."""
        new = self._tok.text_ids(ids)
        if not new:
            return ""
        self._ids.extend(new)
        return self._advance(final=False)

    def flush(self) -> str:
        """Return everything not yet emitted and start over (the next push begins a new text)."""
        out = self._advance(final=True) if self._read < len(self._ids) else ""
        self._ids, self._prefix, self._read, self._emitted = [], 0, 0, []
        return out

    def _advance(self, final: bool) -> str:
        raw = self._tok._decode_raw(self._ids[self._prefix:])
        if not final and raw.endswith(REPLACEMENT):
            return ""
        before = drop_replacement(self._tok._decode_raw(self._ids[self._prefix:self._read]))
        text = drop_replacement(raw)
        if not text.startswith(before):
            return self._resync(final)
        out = text[len(before):]
        if not out:
            return ""
        if not out.isspace():
            # the window may start at the new text: its emitted part then holds more than whitespace,
            # which some decoders (SentencePiece) drop at the start of a text
            self._prefix = self._read
        self._read = len(self._ids)
        self._emitted.append(out)
        return out

    def _resync(self, final: bool) -> str:
        emitted = "".join(self._emitted)
        full = self._tok.decode(self._ids)
        if not full.startswith(emitted):
            # the tokenizer rewrote text already emitted: nothing correct can be added now
            return ""
        if not final and self._tok._decode_raw(self._ids).endswith(REPLACEMENT):
            return ""
        out = full[len(emitted):]
        self._prefix, self._read = 0, len(self._ids)
        self._emitted = [full]
        return out
