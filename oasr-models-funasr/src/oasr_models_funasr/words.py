"""FunASR's word items and their times (``sentence_postprocess`` with timestamps), restated.

With token timestamps, FunASR prints the word items joined by single spaces (every CJK character,
digit and English word is an item) and one ``[start_ms, end_ms]`` per item:

1. ``<s>``, ``</s>``, ``<unk>``, ``<OOV>`` are dropped (the timestamps are then indexed by the kept
   tokens' positions, as FunASR indexes them).
2. All tokens hanzi-like (CJK, ASCII digit, ``@``): one item per token, its own time.  All alphabetic:
   ``@@`` pieces accumulate into the next whole word, whose time runs from the first piece's start to
   its own end.  Mixed: hanzi-like tokens are items with their time, ``@@`` pieces and alphabetic
   tokens as above, anything else (punctuation) an item without a time.
3. Runs of single ASCII letters become one upper-case item spanning its letters.

The character tests compare strings lexicographically exactly as FunASR does (``"0" <= "12" <= "9"``).
"""

from __future__ import annotations

from collections.abc import Sequence

DROPPED = frozenset({"<s>", "</s>", "<unk>", "<OOV>"})
_MARKERS = (" ", "</s>", "<s>", "<unk>", "<OOV>")

Span = list[int]


def _clean(text: str) -> str:
    for marker in _MARKERS:
        text = text.replace(marker, "")
    return text


def _hanzi(text: str) -> bool:
    return "\u4e00" <= text <= "\u9fff" or "0" <= text <= "9" or text == "@"


def all_hanzi(items: Sequence[str]) -> bool:
    cleaned = [_clean(i) for i in items]
    return bool(cleaned) and all(_hanzi(c) for c in cleaned)


def all_alpha(items: Sequence[str]) -> bool:
    cleaned = [_clean(i) for i in items]
    return bool(cleaned) and all((c.isalpha() or c == "'") and not (c.isalpha() and _hanzi(c)) for c in cleaned)


def _letter(text: str) -> bool:
    return len(text) == 1 and text.encode("utf-8").isalpha()


def _word_items(tokens: list[str], times: Sequence[Span]) -> tuple[list[str], list[Span]]:
    """Step 2: items (with ``" "`` after each English word) and the times of the timed items."""
    if all_hanzi(tokens):
        return [t.replace(" ", "") for t in tokens], [list(t) for t in times]
    items: list[str] = []
    spans: list[Span] = []
    pending, begin, end, fresh, after_word = "", -1, -1, True, False
    mixed = not all_alpha(tokens)
    for i, tok in enumerate(tokens):
        if fresh:
            begin, end = times[i]
        if mixed and all_hanzi(tok):
            if after_word:
                items.pop()
            items.append(tok)
            spans.append([begin, end])
            begin, fresh, after_word = end, True, False
        elif "@@" in tok:
            pending += tok.replace("@@", "")
            end, fresh, after_word = times[i][1], False, False
        elif not mixed or all_alpha(tok):
            items += [pending + tok, " "]
            pending = ""
            end = times[i][1]
            spans.append([begin, end])
            begin, fresh, after_word = end, True, True
        else:
            items.append(tok)
    return items, spans


def _abbreviations(items: list[str]) -> tuple[set[int], set[int]]:
    """Step 3: (first, last) item indices of each run ``letter ␠ letter (␠ letter)*``."""
    begins, ends = set(), set()
    n, skip_to = len(items), -1
    for num in range(n):
        if num <= skip_to or not _letter(items[num]):
            continue
        if num + 2 < n and items[num + 1] == " " and _letter(items[num + 2]):
            begins.add(num)
            last = num + 2
            while last + 2 < n and items[last + 1] == " " and _letter(items[last + 2]):
                last += 2
                skip_to = last
            ends.add(last)
    return begins, ends


def funasr_words(tokens: Sequence[str], times: Sequence[Span]) -> tuple[list[str], list[Span]]:
    """Token strings and one ``[start_ms, end_ms]`` per token → (word items, their times), FunASR's
    ``sentence_postprocess(tokens, timestamps)``.  Items without a time (punctuation) get none, so the
    two lists can differ in length, as in FunASR."""
    kept = [t for t in tokens if t not in DROPPED]
    items, spans = _word_items(kept, times)
    begins, ends = _abbreviations(items)
    index, counter = [], 0
    for item in items:
        index.append(counter)
        counter += item != " "
    words: list[str] = []
    out: list[Span] = []
    num, n = 0, len(items)
    while num < n:
        if num in begins:
            start = spans[index[num]][0] if index[num] < len(spans) else None
            word = items[num].upper()
            num += 1
            while num < n and num not in ends:
                word += items[num].upper() if items[num].encode("utf-8").isalpha() else ""
                num += 1
            word += items[num].upper()
            words.append(word)
            if start is not None and index[num] < len(spans):
                out.append([start, spans[index[num]][1]])
        else:
            words.append(items[num])
            if index[num] < len(spans) and items[num] != " ":
                out.append(list(spans[index[num]]))
        num += 1
    return [w for w in words if w != " "], out
