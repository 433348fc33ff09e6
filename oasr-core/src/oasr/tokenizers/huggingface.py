"""``huggingface``: a ``tokenizer.json`` run by the ``tokenizers`` library.

The library decodes and encodes (its decoder handles byte-level, Metaspace and WordPiece joining).
Specials: the file's added tokens marked special, and the spec's ids — which may lie past the
vocabulary, like a CTC blank appended after the pieces.  Non-special added tokens are text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from oasr.errors import CheckpointFormatError
from oasr.tokenizers.base import Tokenizer, TokenizerError, resolve_file


def load_tokenizer_json(path: Path | str) -> Any:
    import tokenizers

    try:
        return tokenizers.Tokenizer.from_file(str(path))
    except Exception as exc:
        raise CheckpointFormatError(f"cannot read {path} as a tokenizer.json: {exc}", path=path) from exc


class HuggingFaceTokenizer(Tokenizer):
    kind = "huggingface"

    def __init__(self, backend: Any, *, special_ids=()):
        self._tk = backend
        added = backend.get_added_tokens_decoder()
        specials = {int(i) for i, tok in added.items() if tok.special}
        super().__init__(vocab_size=backend.get_vocab_size(with_added_tokens=True),
                         special_ids=specials | set(special_ids))

    @classmethod
    def from_file(cls, path: Path | str, *, special_ids=()) -> HuggingFaceTokenizer:
        return cls(load_tokenizer_json(path), special_ids=special_ids)

    @classmethod
    def from_spec(cls, spec: Any, root: Path | str | None) -> HuggingFaceTokenizer:
        return cls.from_file(resolve_file(spec, root, ("tokenizer", "tokenizer_json")), special_ids=spec.special_ids)

    def id_to_piece(self, token_id: int) -> str:
        piece = self._tk.id_to_token(int(token_id)) if token_id >= 0 else None
        if piece is None:
            raise TokenizerError(f"token id {token_id} is outside the vocabulary of {self.vocab_size}", token_id=token_id)
        return piece

    def _decode_raw(self, ids: list[int]) -> str:
        return self._tk.decode(ids, skip_special_tokens=False)

    def encode(self, text: str) -> list[int]:
        return list(self._tk.encode(text, add_special_tokens=False).ids)
