"""``symbol_table``: a WeNet ``units.txt`` / icefall ``tokens.txt`` table of ``piece id`` lines.

Text is the pieces joined, ``▁`` (U+2581, the word boundary of BPE units and the space unit of
character tables) turned into a space, and stripped at both ends — what WeNet's tokenizers and
icefall's decode scripts print.  Specials: the spec's ids plus the conventional pieces ``<blank>``,
``<blk>``, ``<eps>``, ``<unk>``, ``<sos/eos>``, ``<sos>``, ``<eos>``, ``<s>``, ``</s>``, ``<pad>``
and disambiguation symbols ``#0``, ``#1``, ...

Encoding (for hotwords) follows WeNet: with a SentencePiece model (role ``bpe_model``), CJK ideographs
one per unit and other text through the model; a table of BPE-style ``▁word`` pieces without the model
is matched longest-first with ``▁`` word starts; a character table takes each character, a space as
``▁`` (longest match, so multi-character units are found too).  Text is upper- or
lower-cased when every cased piece of the table is.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from oasr.errors import CheckpointFormatError
from oasr.tokenizers.base import Tokenizer, TokenizerError, resolve_file

WORD_BOUNDARY = "\u2581"
SPECIAL_PIECES = frozenset({"<blank>", "<blk>", "<eps>", "<unk>", "<sos/eos>", "<sos>", "<eos>", "<s>", "</s>", "<pad>"})
_DISAMBIG = re.compile(r"#\d+")
_CJK = re.compile(r"([\u4e00-\u9fff])")


def read_symbol_table(path: Path) -> dict[int, str]:
    """``id -> piece`` from a ``piece id`` file; malformed lines and duplicate ids are errors."""
    table: dict[int, str] = {}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) != 2 or not fields[1].lstrip("-").isdigit():
                raise CheckpointFormatError(f"{path}:{lineno}: expected 'piece id', got {line.rstrip()!r}", path=path)
            piece, token_id = fields[0], int(fields[1])
            if token_id < 0 or token_id in table:
                raise CheckpointFormatError(f"{path}:{lineno}: id {token_id} is negative or repeated", path=path)
            table[token_id] = piece
    if not table:
        raise CheckpointFormatError(f"{path} holds no symbols", path=path)
    return table


def is_special_piece(piece: str) -> bool:
    return piece in SPECIAL_PIECES or _DISAMBIG.fullmatch(piece) is not None


class SymbolTableTokenizer(Tokenizer):
    kind = "symbol_table"

    def __init__(self, table: dict[int, str], *, special_ids=(), sentencepiece_model: Path | None = None):
        vocab_size = max(table) + 1
        specials = {i for i, p in table.items() if is_special_piece(p)} | set(special_ids)
        specials |= {i for i in range(vocab_size) if i not in table}
        super().__init__(vocab_size=vocab_size, special_ids=specials)
        self._pieces = [table.get(i, "") for i in range(vocab_size)]
        self._ids = {p: i for i, p in table.items()}
        self._unk = self._ids.get("<unk>")
        self._sp = None
        if sentencepiece_model is not None:
            import sentencepiece

            self._sp = sentencepiece.SentencePieceProcessor(model_file=str(sentencepiece_model))
        cased = [p for p in table.values() if not is_special_piece(p) and p.lower() != p.upper()]
        self._case = "upper" if cased and all(p == p.upper() for p in cased) else (
            "lower" if cased and all(p == p.lower() for p in cased) else None)
        self._bpe_style = any(p.startswith(WORD_BOUNDARY) and len(p) > 1 for p in table.values())
        self._max_len = max(len(p) for p in table.values())

    @classmethod
    def from_spec(cls, spec: Any, root: Path | str | None) -> SymbolTableTokenizer:
        path = resolve_file(spec, root, ("units", "tokens", "symbol_table"))
        bpe = resolve_file(spec, root, ("bpe_model",), required=False)
        return cls(read_symbol_table(path), special_ids=spec.special_ids, sentencepiece_model=bpe)

    def id_to_piece(self, token_id: int) -> str:
        if not 0 <= token_id < self.vocab_size:
            raise TokenizerError(f"token id {token_id} is outside the vocabulary of {self.vocab_size}", token_id=token_id)
        return self._pieces[token_id]

    def token_pieces(self, ids) -> list[str]:
        """Each unit's text (``▁`` as a space, the text's outer whitespace removed)."""
        specials = self.special_ids
        pieces = ["" if int(i) in specials else self.id_to_piece(int(i)).replace(WORD_BOUNDARY, " ") for i in ids]
        for k in range(len(pieces)):
            pieces[k] = pieces[k].lstrip()
            if pieces[k]:
                break
        for k in reversed(range(len(pieces))):
            pieces[k] = pieces[k].rstrip()
            if pieces[k]:
                break
        return pieces

    def _decode_raw(self, ids: list[int]) -> str:
        pieces = self._pieces
        return "".join(pieces[i] for i in ids).replace(WORD_BOUNDARY, " ").strip()

    def encode(self, text: str) -> list[int]:
        if self._case == "upper":
            text = text.upper()
        elif self._case == "lower":
            text = text.lower()
        pieces: list[str] = []
        if self._sp is None and not self._bpe_style:
            # a character table: every character a unit, spaces as the ▁ unit (WeNet's char tokenizer)
            pieces = self._longest_match(WORD_BOUNDARY.join(text.split()))
        else:
            for part in _CJK.split(text.strip()):
                if not part.strip():
                    continue
                if _CJK.fullmatch(part):
                    pieces.append(part)
                elif self._sp is not None:
                    pieces.extend(self._sp.encode(part, out_type=str))
                else:
                    pieces.extend(self._longest_match("".join(WORD_BOUNDARY + w for w in part.split())))
        ids = []
        for piece in pieces:
            token_id = self._ids.get(piece, self._unk)
            if token_id is None:
                raise TokenizerError(f"cannot encode {piece!r} from {text!r}: not in the symbol table, which has no <unk>")
            ids.append(token_id)
        return ids

    def _longest_match(self, stream: str) -> list[str]:
        out, i = [], 0
        while i < len(stream):
            for j in range(min(len(stream), i + self._max_len), i, -1):
                if stream[i:j] in self._ids and not is_special_piece(stream[i:j]):
                    out.append(stream[i:j])
                    i = j
                    break
            else:
                out.append(stream[i])
                i += 1
        return out
