"""Command-line flags for :class:`EngineConfig` fields, generated from the fields themselves.

``oasr transcribe`` and ``oasr serve`` take their engine flags from here, so each flag's type,
choices and default are the field's and the two commands cannot disagree.  Only the flag names and
help texts are written down, in :data:`ENGINE_FLAGS`.
"""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Sequence
from typing import Any

import attrs

from oasr.engine.config import EngineConfig


@attrs.frozen
class Flag:
    names: tuple[str, ...]
    help: str


#: EngineConfig field -> its flag names and help
ENGINE_FLAGS: dict[str, Flag] = {
    "model": Flag(("--model", "-m"), "checkpoint directory, alias or hub id (default: the embedded default model)"),
    "architecture": Flag(("--architecture",), "force an architecture instead of detecting one"),
    "device": Flag(("--device",), "device to run on (cpu, cuda, cuda:N)"),
    "dtype": Flag(("--dtype",), "compute dtype (default: the model's)"),
    "quantization": Flag(("--quantization",), "weight quantization"),
    "max_batch_size": Flag(("--max-batch-size", "--batch-size"),
                           "requests decoded together (cross-request batching; 1 disables it)"),
    "max_batch_frames": Flag(("--max-batch-frames",), "cap on padded feature frames per batch"),
    "max_wait_time": Flag(("--max-wait-time",), "seconds a partial batch waits for more requests"),
    "schedule_policy": Flag(("--schedule-policy",), "how waiting requests are grouped into batches"),
    "max_audio_seconds": Flag(("--max-audio-seconds",), "refuse longer audio"),
    "decode_method": Flag(("--decode-method",), "decode method (default: the model's)"),
    "num_threads": Flag(("--threads",), "torch intra-op threads"),
    "chunk_size": Flag(("--chunk-size",), "streaming chunk in the model's streaming unit (WeNet: encoder frames; Zipformer: icefall's "
                                          "--chunk-size; none: the model's release geometry)"),
    "num_left_chunks": Flag(("--num-left-chunks",), "left chunks of context kept per stream (-1: all)"),
    "max_streams": Flag(("--max-streams",), "streams open at once"),
    "max_stream_seconds": Flag(("--max-stream-seconds",), "longest stream"),
}


def _scalar_type(annotation: Any) -> type:
    """``int`` for ``int`` or ``int | None``, and so on."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        (annotation,) = args
    return annotation


def _choices(field: attrs.Attribute) -> tuple[Any, ...] | None:
    options = getattr(field.validator, "options", None)
    return None if options is None else tuple(o for o in options if o is not None)


def add_engine_flags(parser: argparse.ArgumentParser | Any, fields: Sequence[str]) -> None:
    """Add the flags of ``fields`` (EngineConfig field names) to a parser or argument group."""
    attrs.resolve_types(EngineConfig)
    by_name = attrs.fields_dict(EngineConfig)
    for name in fields:
        field, flag = by_name[name], ENGINE_FLAGS[name]
        kind = _scalar_type(field.type)
        default = field.default
        shown = "none" if default is None else default
        kwargs: dict[str, Any] = {"dest": name, "default": default, "help": f"{flag.help} (default: {shown})"}
        if kind is not str:
            kwargs["type"] = kind
        choices = _choices(field)
        if choices is not None:
            kwargs["choices"] = choices
        parser.add_argument(*flag.names, **kwargs)


def engine_config_kwargs(args: argparse.Namespace, fields: Sequence[str]) -> dict[str, Any]:
    """The EngineConfig keyword arguments of parsed ``fields``."""
    return {name: getattr(args, name) for name in fields}
