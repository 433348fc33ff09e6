"""Transcript output formats shared by ``oasr transcribe`` and the server.

``text``, ``json`` ({"text"}), ``verbose_json`` (OpenAI's schema: task, language, duration, text,
segments[], words[]), ``srt`` and ``vtt`` are the API's formats; the command line adds openai-whisper's
``txt`` (one line per segment) and ``tsv`` (start and end in milliseconds).  Subtitles follow
openai-whisper's writers: with word timings, :class:`SubtitleLayout` re-cuts them into lines of at
most ``max_line_width`` characters (or ``max_words_per_line`` words), ``max_line_count`` lines per
subtitle, and ``highlight_words`` underlines each word while it is spoken.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import attrs

from oasr.decoding.types import Segment
from oasr.engine.options import RequestOutput

FORMATS = ("text", "json", "verbose_json", "srt", "vtt")
#: formats of ``oasr transcribe`` (the API's, openai-whisper's ``txt`` and ``tsv``)
CLI_FORMATS = ("text", "txt", "json", "verbose_json", "srt", "vtt", "tsv")
#: a pause longer than this starts a new subtitle when lines are re-cut (openai-whisper's rule)
LONG_PAUSE_SECONDS = 3.0


@attrs.frozen(kw_only=True)
class SubtitleLayout:
    """How subtitles are cut from word timings (openai-whisper's writer options; None: no limit)."""

    max_line_width: int | None = attrs.field(default=None, validator=attrs.validators.optional(attrs.validators.ge(1)))
    max_line_count: int | None = attrs.field(default=None, validator=attrs.validators.optional(attrs.validators.ge(1)))
    max_words_per_line: int | None = attrs.field(default=None,
                                                 validator=attrs.validators.optional(attrs.validators.ge(1)))
    highlight_words: bool = False


def _timestamp(seconds: float, *, decimal: str) -> str:
    millis = max(0, round(seconds * 1000))
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal}{millis:03d}"


def _within(seconds: float, duration: float | None) -> float:
    """A time rounded to the millisecond and never past the audio's end (a window's last timestamp
    token can name a time beyond it)."""
    seconds = round(seconds, 3)
    return min(seconds, round(duration, 3)) if duration else seconds


def segments_of(output: RequestOutput) -> list[dict[str, Any]]:
    """OpenAI's verbose_json segments; ``seek`` is the decoding window's start in frames."""
    segments = output.segments or ([Segment(0, 0.0, output.duration or 0.0, output.text)] if output.text else [])
    duration = output.duration
    return [
        {
            "id": s.id,
            "seek": s.seek or 0,
            "start": _within(s.start, duration),
            "end": _within(s.end, duration),
            "text": s.text,
            "tokens": list(s.tokens),
            "temperature": s.temperature if s.temperature is not None else 0.0,
            "avg_logprob": s.avg_logprob if s.avg_logprob is not None else 0.0,
            "compression_ratio": s.compression_ratio if s.compression_ratio is not None else 0.0,
            "no_speech_prob": s.no_speech_prob if s.no_speech_prob is not None else 0.0,
        }
        for s in segments
    ]


def words_of(output: RequestOutput) -> list[dict[str, Any]]:
    words = output.words or [w for s in (output.segments or []) for w in (s.words or [])]
    duration = output.duration
    return [{"word": w.word, "start": _within(w.start, duration), "end": _within(w.end, duration)} for w in words]


def verbose_json(output: RequestOutput, *, task: str = "transcribe", include_words: bool = True,
                 include_segments: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {
        "task": task,
        "language": output.language or "",
        "duration": round(output.duration or 0.0, 3),
        "text": output.text,
    }
    if include_segments:
        body["segments"] = segments_of(output)
    if include_words and output.words is not None:
        body["words"] = words_of(output)
    return body


def _subtitle_words(segments: list[dict[str, Any]], layout: SubtitleLayout) -> Iterator[list[dict[str, Any]]]:
    """Groups of words, one per subtitle; a word that starts a new line carries a leading newline.

    Without both a line width and a line count each segment keeps its own subtitles (cut every
    ``max_words_per_line`` words); with both, lines flow across segments and a subtitle ends after
    ``max_line_count`` lines or before a pause of more than three seconds.
    """
    keep_segments = layout.max_line_count is None or layout.max_line_width is None
    width = layout.max_line_width or 1000
    per_line = layout.max_words_per_line or 1000
    current: list[dict[str, Any]] = []
    line_len, lines = 0, 1
    last = next((w["start"] for s in segments for w in s["words"]), segments[0]["start"] if segments else 0.0)
    for segment in segments:
        words = segment["words"]
        for first in range(0, len(words), per_line):
            for offset, source in enumerate(words[first:first + per_line]):
                word = dict(source)
                pause = not keep_segments and word["start"] - last > LONG_PAUSE_SECONDS
                new_segment = keep_segments and offset == 0 and bool(current)
                if line_len > 0 and line_len + len(word["word"]) <= width and not pause and not new_segment:
                    line_len += len(word["word"])
                else:
                    word["word"] = word["word"].strip()
                    full = layout.max_line_count is not None and (pause or lines >= layout.max_line_count)
                    if new_segment or (current and full):
                        yield current
                        current, lines = [], 1
                    elif line_len > 0:
                        lines += 1
                        word["word"] = "\n" + word["word"]
                    line_len = len(word["word"].strip())
                current.append(word)
                last = word["start"]
    if current:
        yield current


def _spaced_words(segment: Segment) -> list[dict[str, Any]]:
    """A segment's words, each with the whitespace that precedes it in the segment's text (families
    whose words carry no leading space still print as the text does)."""
    out, pos = [], 0
    for w in segment.words or []:
        bare = w.word.strip()
        at = segment.text.find(bare, pos) if bare else -1
        word = w.word
        if at >= 0:
            lead = segment.text[pos:at]
            word = (lead if lead and lead.isspace() else w.word[:len(w.word) - len(w.word.lstrip())]) + bare
            pos = at + len(bare)
        out.append({"word": word, "start": w.start, "end": w.end})
    return out


def subtitles(output: RequestOutput, layout: SubtitleLayout | None = None) -> Iterator[tuple[float, float, str]]:
    """(start, end, text) of each subtitle: one per segment, or re-cut from word timings."""
    layout = layout or SubtitleLayout()
    segments = segments_of(output)
    words = [w for s in (output.segments or []) for w in (s.words or [])]
    if not words or not output.segments:
        for seg in segments:
            yield seg["start"], seg["end"], seg["text"].strip().replace("-->", "->")
        return
    timed = [{"start": s.start, "words": _spaced_words(s)} for s in output.segments]
    for group in _subtitle_words(timed, layout):
        text = "".join(w["word"] for w in group)
        if not layout.highlight_words:
            yield group[0]["start"], group[-1]["end"], text
            continue
        shown = [w["word"] for w in group]
        cursor = group[0]["start"]
        for i, word in enumerate(group):
            if _timestamp(cursor, decimal=".") != _timestamp(word["start"], decimal="."):
                yield cursor, word["start"], text
            marked = [re.sub(r"^(\s*)(.*)$", r"\1<u>\2</u>", w) if j == i else w for j, w in enumerate(shown)]
            yield word["start"], word["end"], "".join(marked)
            cursor = word["end"]


def to_srt(output: RequestOutput, layout: SubtitleLayout | None = None) -> str:
    blocks = []
    for i, (start, end, text) in enumerate(subtitles(output, layout), start=1):
        blocks.append(f"{i}\n{_timestamp(start, decimal=',')} --> {_timestamp(end, decimal=',')}\n{text}\n")
    return "\n".join(blocks)


def to_vtt(output: RequestOutput, layout: SubtitleLayout | None = None) -> str:
    lines = ["WEBVTT", ""]
    for start, end, text in subtitles(output, layout):
        lines.append(f"{_timestamp(start, decimal='.')} --> {_timestamp(end, decimal='.')}")
        lines.append(text)
        lines.append("")
    return "\n".join(lines)


def to_txt(output: RequestOutput) -> str:
    """openai-whisper's txt: each segment's text on its own line."""
    return "".join(seg["text"].strip() + "\n" for seg in segments_of(output))


def to_tsv(output: RequestOutput) -> str:
    """openai-whisper's tsv: a header, then start and end in integer milliseconds and the text."""
    rows = ["start\tend\ttext"]
    for seg in segments_of(output):
        rows.append(f"{round(1000 * seg['start'])}\t{round(1000 * seg['end'])}\t"
                    f"{seg['text'].strip().replace(chr(9), ' ')}")
    return "\n".join(rows) + "\n"


def render(output: RequestOutput, fmt: str, *, task: str = "transcribe", layout: SubtitleLayout | None = None) -> str:
    """The output as the named format (a string; JSON formats serialized)."""
    if fmt == "text":
        return output.text.strip() + "\n"
    if fmt == "txt":
        return to_txt(output)
    if fmt == "tsv":
        return to_tsv(output)
    if fmt == "json":
        return json.dumps({"text": output.text}, ensure_ascii=False) + "\n"
    if fmt == "verbose_json":
        return json.dumps(verbose_json(output, task=task), ensure_ascii=False, indent=2) + "\n"
    if fmt == "srt":
        return to_srt(output, layout)
    if fmt == "vtt":
        return to_vtt(output, layout)
    raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(CLI_FORMATS)}")
