"""Transcript output formats shared by ``oasr transcribe`` and the server.

``text``, ``json`` ({"text"}), ``verbose_json`` (OpenAI's schema: task, language, duration, text,
segments[], words[]), ``srt`` and ``vtt``.
"""

from __future__ import annotations

import json
from typing import Any

from oasr.decoding.types import Segment
from oasr.engine.options import RequestOutput

FORMATS = ("text", "json", "verbose_json", "srt", "vtt")


def _timestamp(seconds: float, *, decimal: str) -> str:
    millis = max(0, round(seconds * 1000))
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal}{millis:03d}"


def segments_of(output: RequestOutput) -> list[dict[str, Any]]:
    segments = output.segments or ([Segment(0, 0.0, output.duration or 0.0, output.text)] if output.text else [])
    return [
        {
            "id": s.id,
            "seek": 0,
            "start": round(s.start, 3),
            "end": round(s.end, 3),
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
    return [{"word": w.word, "start": round(w.start, 3), "end": round(w.end, 3)} for w in words]


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


def to_srt(output: RequestOutput) -> str:
    blocks = []
    for i, seg in enumerate(segments_of(output), start=1):
        start, end = _timestamp(seg["start"], decimal=","), _timestamp(seg["end"], decimal=",")
        blocks.append(f"{i}\n{start} --> {end}\n{seg['text'].strip()}\n")
    return "\n".join(blocks)


def to_vtt(output: RequestOutput) -> str:
    lines = ["WEBVTT", ""]
    for seg in segments_of(output):
        lines.append(f"{_timestamp(seg['start'], decimal='.')} --> {_timestamp(seg['end'], decimal='.')}")
        lines.append(seg["text"].strip())
        lines.append("")
    return "\n".join(lines)


def render(output: RequestOutput, fmt: str, *, task: str = "transcribe") -> str:
    """The output as the named format (a string; JSON formats serialized)."""
    if fmt == "text":
        return output.text.strip() + "\n"
    if fmt == "json":
        return json.dumps({"text": output.text}, ensure_ascii=False) + "\n"
    if fmt == "verbose_json":
        return json.dumps(verbose_json(output, task=task), ensure_ascii=False, indent=2) + "\n"
    if fmt == "srt":
        return to_srt(output)
    if fmt == "vtt":
        return to_vtt(output)
    raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
