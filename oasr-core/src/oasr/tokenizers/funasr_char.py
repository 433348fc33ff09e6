"""``funasr_char``: a FunASR token list (``tokens.json`` list or ``tokens.txt`` one per line) and
FunASR's sentence post-processing, which is what Paraformer prints.

The post-processing (``funasr.utils.postprocess_utils.sentence_postprocess``), restated:

1. Tokens ``<s>``, ``</s>``, ``<unk>``, ``<OOV>`` are dropped.
2. A token is *hanzi-like* when each character is a CJK ideograph (U+4E00..U+9FFF), an ASCII digit or
   ``@``; *alpha* when each character is a letter (not an ideograph) or an apostrophe.  (Before the
   tests, spaces and the markers above are removed from the token.)  Over the whole sequence FunASR
   applies the same tests to each token as a string, comparing it lexicographically to the ranges —
   reproduced here, with its consequences for unusual multi-character tokens.
3. All hanzi-like: tokens are joined with spaces removed.  All alpha: each token is a word followed
   by a space.  Otherwise, token by token: hanzi-like tokens are appended (removing the item before
   them if the previous word left a space there); tokens containing ``@@`` accumulate, without the
   marker, into the next alpha word (so ``hel@@ lo`` is ``hello``; an unfinished word is dropped);
   alpha tokens end a word, followed by a space; anything else is appended as is.
4. Runs of single ASCII letters separated by single spaces become one upper-case abbreviation
   (``a b c`` is ``ABC``).
5. The items are joined and stripped.

Text can therefore change behind the newest token (an abbreviation grows, a word waits for its end),
so the incremental decoder releases text only up to the last hanzi-like token that closes everything
before it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from oasr.errors import CheckpointFormatError
from oasr.tokenizers.base import IncrementalDecoder, Tokenizer, TokenizerError, resolve_file

DROPPED_TOKENS = frozenset({"<s>", "</s>", "<unk>", "<OOV>"})
SPECIAL_PIECES = frozenset({"<blank>", "<blk>", "<pad>", "<s>", "</s>", "<unk>", "<OOV>", "<sos/eos>"})
_MARKERS = (" ", "</s>", "<s>", "<unk>", "<OOV>")  # removed, in this order, before the script tests
_CONTINUATION = "@@"

# A segment is (text, index of the token that produced it); an item is a list of segments.
Segment = tuple[str, int]


def _scrub(text: str) -> str:
    for marker in _MARKERS:
        text = text.replace(marker, "")
    return text


def _hanzi_like(text: str) -> bool:
    # lexicographic comparisons, as FunASR makes them (exact for one character)
    return "\u4e00" <= text <= "\u9fff" or "0" <= text <= "9" or text == "@"


def _alpha_like(text: str) -> bool:
    is_alpha = text.isalpha()
    return (is_alpha or text == "'") and not (is_alpha and _hanzi_like(text))


def _token_is(test, token: str) -> bool:
    chars = [_scrub(ch) for ch in token]
    return bool(chars) and all(test(ch) for ch in chars)


def _sequence_is(test, tokens: Sequence[str]) -> bool:
    return bool(tokens) and all(test(_scrub(tok)) for tok in tokens)


def _single_letter(item: list[Segment]) -> bool:
    text = "".join(t for t, _ in item)
    return len(text) == 1 and text.isascii() and text.isalpha()


def _is_space(item: list[Segment]) -> bool:
    return "".join(t for t, _ in item) == " "


def _items(tokens: Sequence[str]) -> list[list[Segment]]:
    """Step 3: the word items of the token sequence, each segment tagged with its token index."""
    if _sequence_is(_hanzi_like, tokens):
        return [[(tok.replace(" ", ""), i)] for i, tok in enumerate(tokens)]
    items: list[list[Segment]] = []
    if _sequence_is(_alpha_like, tokens):
        for i, tok in enumerate(tokens):
            items += [[(tok, i)], [(" ", i)]]
        return items
    pending: list[Segment] = []
    after_word = False
    for i, tok in enumerate(tokens):
        if _token_is(_hanzi_like, tok):
            if after_word:
                items.pop()
            items.append([(tok, i)])
            after_word = False
        elif _CONTINUATION in tok:
            pending.append((tok.replace(_CONTINUATION, ""), i))
            after_word = False
        elif _token_is(_alpha_like, tok):
            items += [pending + [(tok, i)], [(" ", i)]]
            pending = []
            after_word = True
        else:
            items.append([(tok, i)])
    return items


def _merge_abbreviations(items: list[list[Segment]]) -> list[list[Segment]]:
    """Step 4: maximal runs ``letter ␠ letter (␠ letter)*`` become one upper-case item."""
    out: list[list[Segment]] = []
    k, n = 0, len(items)
    while k < n:
        end = k
        while end + 2 < n and _single_letter(items[end]) and _is_space(items[end + 1]) and _single_letter(items[end + 2]):
            end += 2
        if end > k:
            out.append([(t.upper(), i) for j in range(k, end + 1, 2) for t, i in items[j]])
            k = end + 1
        else:
            out.append(items[k])
            k += 1
    return out


def postprocess_segments(tokens: Sequence[str]) -> list[Segment]:
    """FunASR's sentence post-processing of token strings, as text segments tagged by token index."""
    kept = [(i, tok) for i, tok in enumerate(tokens) if tok not in DROPPED_TOKENS]
    items = _merge_abbreviations(_items([tok for _, tok in kept]))
    segments = [(text, kept[i][0]) for item in items for text, i in item if text]
    # step 5: strip the whole text
    while segments and not segments[0][0].lstrip():
        segments.pop(0)
    if segments:
        segments[0] = (segments[0][0].lstrip(), segments[0][1])
    while segments and not segments[-1][0].rstrip():
        segments.pop()
    if segments:
        segments[-1] = (segments[-1][0].rstrip(), segments[-1][1])
    return segments


def sentence_postprocess(tokens: Sequence[str]) -> str:
    return "".join(text for text, _ in postprocess_segments(tokens))


def read_token_list(path: Path) -> list[str]:
    if path.suffix == ".json":
        try:
            tokens = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise CheckpointFormatError(f"{path} is not valid JSON: {exc}", path=path) from exc
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            raise CheckpointFormatError(f"{path} must hold a JSON list of token strings", path=path)
        return tokens
    return [line.rstrip() for line in path.read_text(encoding="utf-8").splitlines()]


class FunAsrCharTokenizer(Tokenizer):
    kind = "funasr_char"

    def __init__(self, tokens: Sequence[str], *, special_ids=()):
        self._tokens = list(tokens)
        seen: dict[str, int] = {}
        for i, tok in enumerate(self._tokens):
            if tok in seen:
                raise CheckpointFormatError(f"FunASR token {tok!r} appears twice (ids {seen[tok]} and {i})")
            seen[tok] = i
        self._ids = seen
        specials = {i for i, t in enumerate(self._tokens) if t in SPECIAL_PIECES}
        super().__init__(vocab_size=len(self._tokens), special_ids=specials | set(special_ids))
        cased = [t for t in self._tokens if t not in SPECIAL_PIECES and t.lower() != t.upper()]
        self._lower = bool(cased) and all(t == t.lower() for t in cased)

    @classmethod
    def from_spec(cls, spec: Any, root: Path | str | None) -> FunAsrCharTokenizer:
        path = resolve_file(spec, root, ("tokens", "token_list"))
        return cls(read_token_list(path), special_ids=spec.special_ids)

    def id_to_piece(self, token_id: int) -> str:
        if not 0 <= token_id < self.vocab_size:
            raise TokenizerError(f"token id {token_id} is outside the vocabulary of {self.vocab_size}", token_id=token_id)
        return self._tokens[token_id]

    def _decode_raw(self, ids: list[int]) -> str:
        return sentence_postprocess([self._tokens[i] for i in ids])

    def token_pieces(self, ids: Sequence[int]) -> list[str]:
        """Each token's share of the text; text made by several tokens goes to the latest of them."""
        positions = [k for k, token_id in enumerate(ids) if int(token_id) not in self.special_ids]
        kept = self.text_ids(ids)
        pieces = [""] * len(ids)
        latest = -1
        for text, i in postprocess_segments([self._tokens[t] for t in kept]):
            latest = max(latest, i)
            pieces[positions[latest]] += text
        return pieces

    def incremental_decoder(self) -> IncrementalDecoder:
        return _FunAsrIncrementalDecoder(self)

    def encode(self, text: str) -> list[int]:
        """CJK characters one per token; other words as a whole token or ``@@`` pieces, else ``<unk>``."""
        if self._lower:
            text = text.lower()
        out: list[int] = []
        for word in text.split():
            run = ""
            for ch in word:
                if "\u4e00" <= ch <= "\u9fff":
                    out += self._encode_word(run, text) if run else []
                    out.append(self._lookup(ch, text))
                    run = ""
                else:
                    run += ch
            out += self._encode_word(run, text) if run else []
        return out

    def _lookup(self, piece: str, text: str) -> int:
        token_id = self._ids.get(piece, self._ids.get("<unk>"))
        if token_id is None:
            raise TokenizerError(f"cannot encode {piece!r} of {text!r}: not a token, and the vocabulary has no <unk>")
        return token_id

    def _encode_word(self, word: str, text: str) -> list[int]:
        out, rest = [], word
        while rest:
            if rest in self._ids:
                out.append(self._ids[rest])
                return out
            for j in range(len(rest) - 1, 0, -1):
                if rest[:j] + _CONTINUATION in self._ids:
                    out.append(self._ids[rest[:j] + _CONTINUATION])
                    rest = rest[j:]
                    break
            else:
                out += [self._lookup(ch, text) for ch in rest]
                return out
        return out


class _FunAsrIncrementalDecoder(IncrementalDecoder):
    """Releases text up to the last *closing* token: a hanzi-like token with no unfinished ``@@`` word
    before it.  Nothing before such a token can change (abbreviations and words cannot span it), and
    the text of the tokens before it ends in it.  A token containing a space switches early release off,
    because FunASR joins all-hanzi sequences with spaces removed but keeps them in mixed ones."""

    def __init__(self, tokenizer: FunAsrCharTokenizer):
        super().__init__(tokenizer)
        self._tok: FunAsrCharTokenizer = tokenizer
        self._cut = 0
        self._unfinished_word = False
        self._spaces = False
        self._done = ""

    def push(self, ids: Iterable[int]) -> str:
        tokens = self._tok._tokens
        for token_id in self._tok.text_ids(ids):
            self._ids.append(token_id)
            tok = tokens[token_id]
            if tok in DROPPED_TOKENS:
                continue
            self._spaces = self._spaces or " " in tok
            if _token_is(_hanzi_like, tok):
                if not self._unfinished_word and not self._spaces:
                    self._cut = len(self._ids)
            elif _CONTINUATION in tok:
                self._unfinished_word = True
            elif _token_is(_alpha_like, tok):
                self._unfinished_word = False
        text = self._tok.decode(self._ids[:self._cut])
        if not text.startswith(self._done):
            return ""
        out, self._done = text[len(self._done):], text
        return out

    def flush(self) -> str:
        text = self._tok.decode(self._ids)
        out = text[len(self._done):] if text.startswith(self._done) else ""
        self._ids, self._cut, self._unfinished_word, self._spaces, self._done = [], 0, False, False, ""
        return out
