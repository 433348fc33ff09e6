"""``sentencepiece``: a SentencePiece model (``bpe.model``), decoded and encoded by the library itself.

Specials: control pieces (``<s>``, ``</s>``), the unknown piece, user-defined pieces with the
conventional special names (icefall's ``<blk>`` and ``<sos/eos>``), and the spec's ids — except the
unknown piece with ``options["show_unknown"]``: it is then text, which SentencePiece renders ``" ⁇ "``
(as NeMo's transcripts show it).  Byte-fallback pieces (``<0xE4>``) decode to their bytes; an incomplete character is held back by the incremental
decoder and dropped by :meth:`decode`.  Encoding upper- or lower-cases text when every cased piece of
the model is (icefall's LibriSpeech BPE is upper case).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from oasr.tokenizers.base import Tokenizer, TokenizerError, resolve_file
from oasr.tokenizers.symbol_table import is_special_piece


class SentencePieceTokenizer(Tokenizer):
    kind = "sentencepiece"

    def __init__(self, model: Path | str | bytes, *, special_ids=(), show_unknown: bool = False):
        import sentencepiece

        if isinstance(model, bytes):
            sp = sentencepiece.SentencePieceProcessor(model_proto=model)
        else:
            sp = sentencepiece.SentencePieceProcessor(model_file=str(model))
        self._sp = sp
        size = sp.get_piece_size()
        specials = {i for i in range(size) if sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i)
                    or is_special_piece(sp.id_to_piece(i))}
        if show_unknown:
            specials -= {i for i in range(size) if sp.is_unknown(i)}
        super().__init__(vocab_size=size, special_ids=specials | set(special_ids))
        cased = [sp.id_to_piece(i) for i in range(size)
                 if i not in specials and not sp.is_byte(i) and sp.id_to_piece(i).lower() != sp.id_to_piece(i).upper()]
        self._case = "upper" if cased and all(p == p.upper() for p in cased) else (
            "lower" if cased and all(p == p.lower() for p in cased) else None)

    @classmethod
    def from_spec(cls, spec: Any, root: Path | str | None) -> SentencePieceTokenizer:
        return cls(resolve_file(spec, root, ("model", "bpe_model", "sentencepiece")), special_ids=spec.special_ids,
                   show_unknown=bool(spec.options.get("show_unknown", False)))

    def id_to_piece(self, token_id: int) -> str:
        if not 0 <= token_id < self.vocab_size:
            raise TokenizerError(f"token id {token_id} is outside the vocabulary of {self.vocab_size}", token_id=token_id)
        return self._sp.id_to_piece(token_id)

    def _decode_raw(self, ids: list[int]) -> str:
        return self._sp.decode(ids)

    def encode(self, text: str) -> list[int]:
        if self._case == "upper":
            text = text.upper()
        elif self._case == "lower":
            text = text.lower()
        return list(self._sp.encode(text))
