"""The decoding flags of ``oasr transcribe`` and how each maps to openai-whisper / faster-whisper.

A decoding flag names one option field.  At run time the flag goes to the per-request
:class:`~oasr.engine.options.DecodingOptions` when that class has the field, else to the decode
strategy's engine-level options class when *it* has the field.  A flag the user set that neither
takes is refused with one line naming the flag and the decode method; a flag left at its reference
default is passed only where a field takes it, so a model family without it is not refused.

:data:`REFERENCE_OPTIONS` lists every option of openai-whisper's CLI and faster-whisper's
``WhisperModel.transcribe()`` with the ``oasr`` flag that serves it; ``scripts/gen_docs.py`` renders
it as the table in ``docs/cli.md`` and checks that every flag it names exists.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import attrs


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text}")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def optional_float(text: str) -> float | None:
    """A float, or ``None`` (openai-whisper's spelling for 'off')."""
    if text.lower() == "none":
        return None
    value = float(text)
    if math.isnan(value):
        raise argparse.ArgumentTypeError("must be a number or None, got nan")
    return value


def str2bool(text: str) -> bool:
    """openai-whisper's boolean values (``True``/``False``), plus yes/no/1/0."""
    lowered = text.lower()
    if lowered in ("true", "yes", "1", "on"):
        return True
    if lowered in ("false", "no", "0", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected True or False, got {text!r}")


def token_ids(text: str) -> tuple[int, ...]:
    """A comma-separated list of token ids (``-1``: the model's non-speech symbols, as openai-whisper)."""
    try:
        return tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated token ids such as '-1' or '-1,220', got {text!r}") \
            from None


@attrs.frozen
class Flag:
    """One decoding flag: ``--name`` sets option field ``field``."""

    name: str
    field: str
    help: str
    type: Any = None
    #: the value openai-whisper / faster-whisper use when the option is not given (shown in help)
    reference_default: Any = None
    boolean: bool = False
    metavar: str | None = None


FLAGS: tuple[Flag, ...] = (
    Flag("beam-size", "beam_size", "beams in beam search (>= 1; default: the model's, greedy for Whisper, as "
         "whisper.transcribe(); the openai-whisper CLI and faster-whisper use 5)", positive_int, metavar="N"),
    Flag("best-of", "best_of", "candidates sampled per window at a non-zero temperature (>= 1)", positive_int, 5,
         metavar="N"),
    Flag("patience", "patience", "beam search patience factor (> 0; 1.0: stop at beam-size finished hypotheses)",
         positive_float, 1.0, metavar="X"),
    Flag("length-penalty", "length_penalty", "length penalty alpha of beam scores (default: simple length "
         "normalization)", float, metavar="ALPHA"),
    Flag("suppress-tokens", "suppress_tokens", "comma-separated token ids to suppress (write --suppress-tokens=-1,...; '-1': the non-speech "
         "symbols)", token_ids, (-1,), metavar="IDS"),
    Flag("initial-prompt", "initial_prompt", "text given as the previous window's transcript to the first window",
         str, metavar="TEXT"),
    Flag("condition-on-previous-text", "condition_on_previous_text", "give each window the previous window's text as "
         "its prompt", reference_default=True, boolean=True),
    Flag("prompt-reset-on-temperature", "prompt_reset_on_temperature", "a window decoded above this temperature "
         "does not prompt the next one", non_negative_float, 0.5, metavar="T"),
    Flag("compression-ratio-threshold", "compression_ratio_threshold", "a window whose gzip compression ratio is "
         "above this is decoded again at the next temperature (None: never)", optional_float, 2.4, metavar="X"),
    Flag("logprob-threshold", "logprob_threshold", "a window whose average log-probability is below this is decoded "
         "again at the next temperature (None: never)", optional_float, -1.0, metavar="X"),
    Flag("no-speech-threshold", "no_speech_threshold", "a window whose no-speech probability is above this and whose "
         "log-probability is below --logprob-threshold is skipped as silence (None: never)", optional_float, 0.6,
         metavar="X"),
    Flag("without-timestamps", "without_timestamps", "decode without timestamp tokens (faster-whisper's "
         "without_timestamps)", reference_default=False, boolean=True),
    Flag("max-new-tokens", "max_new_tokens", "most tokens decoded per window", positive_int, metavar="N"),
    Flag("clip-timestamps", "clip_timestamps", "comma-separated start,end,... seconds of the clips to transcribe",
         str, "0", metavar="LIST"),
    Flag("hallucination-silence-threshold", "hallucination_silence_threshold", "with word timings: skip silences "
         "longer than this (seconds) around a possible hallucination", non_negative_float, metavar="SECONDS"),
    Flag("hotwords", "hotwords", "a word or phrase to bias decoding towards (repeatable; families with "
         "contextual biasing)", str, metavar="TEXT"),
    Flag("batched", "batched", "batched long-form, as faster-whisper's BatchedInferencePipeline: VAD speech in "
         "chunks of up to 30 s, each decoded on its own, --batch-size at a time (Whisper)", boolean=True),
)

#: (openai-whisper CLI, faster-whisper transcribe(), oasr flag or None, note) — every option of both
REFERENCE_OPTIONS: tuple[tuple[str | None, str | None, str | None, str], ...] = (
    ("audio", "audio", "AUDIO...", "files, directories (recursively, tree mirrored under -o) or glob patterns"),
    ("--model", None, "--model", "checkpoint directory, alias (tiny.en, base, large-v3, turbo, ...) or hub id"),
    ("--model_dir", "download_root (constructor)", "--model-dir", "hub cache directory for downloaded models"),
    ("--device", "device (constructor)", "--device", "auto (default): CUDA when available, else CPU"),
    ("--output_dir / -o", None, "--output-dir / -o", "oasr prints to stdout unless -o is given"),
    ("--output_format / -f", None, "--output-format / -f", "txt, vtt, srt, tsv, json, all; also text, "
     "verbose_json (OpenAI's API formats; oasr's json is the API's {\"text\"}, verbose_json is whisper's json)"),
    ("--verbose", "log_progress", "--verbose", "print segments as they are final; False: progress bar only"),
    ("--task", "task", "--task", "transcribe or translate"),
    ("--language", "language", "--language", "language code; detected when not given"),
    ("--temperature", "temperature", "--temperature", "first temperature of the fallback schedule"),
    ("--temperature_increment_on_fallback", "temperature (a list)", "--temperature-increment-on-fallback",
     "schedule: temperature, +increment, ... up to 1.0 (None: no fallback)"),
    ("--best_of", "best_of", "--best-of", ""),
    ("--beam_size", "beam_size", "--beam-size", "default: the model's (greedy for Whisper, as whisper.transcribe())"),
    ("--patience", "patience", "--patience", ""),
    ("--length_penalty", "length_penalty", "--length-penalty", ""),
    (None, "repetition_penalty", None, "not served yet"),
    (None, "no_repeat_ngram_size", None, "not served yet"),
    ("--suppress_tokens", "suppress_tokens", "--suppress-tokens", ""),
    (None, "suppress_blank", None, "always on (the reference default)"),
    ("--initial_prompt", "initial_prompt", "--initial-prompt", ""),
    ("--carry_initial_prompt", None, None, "not served: the initial prompt conditions the first window only"),
    (None, "prefix", None, "not served yet"),
    ("--condition_on_previous_text", "condition_on_previous_text", "--condition-on-previous-text", ""),
    (None, "prompt_reset_on_temperature", "--prompt-reset-on-temperature", ""),
    ("--fp16", "compute_type (constructor)", "--dtype", "float16 / bfloat16 / float32 (default: the model's; never "
     "bf16 on CPU)"),
    ("--compression_ratio_threshold", "compression_ratio_threshold", "--compression-ratio-threshold", ""),
    ("--logprob_threshold", "log_prob_threshold", "--logprob-threshold", ""),
    ("--no_speech_threshold", "no_speech_threshold", "--no-speech-threshold", ""),
    ("--word_timestamps", "word_timestamps", "--word-timestamps", ""),
    ("--prepend_punctuations", "prepend_punctuations", None, "fixed at the reference default"),
    ("--append_punctuations", "append_punctuations", None, "fixed at the reference default"),
    ("--highlight_words", None, "--highlight-words", "srt/vtt: underline each word as it is spoken"),
    ("--max_line_width", None, "--max-line-width", "srt/vtt: characters per line"),
    ("--max_line_count", None, "--max-line-count", "srt/vtt: lines per subtitle"),
    ("--max_words_per_line", None, "--max-words-per-line", "srt/vtt: words per line"),
    ("--threads", "cpu_threads (constructor)", "--threads", ""),
    ("--clip_timestamps", "clip_timestamps", "--clip-timestamps", ""),
    ("--hallucination_silence_threshold", "hallucination_silence_threshold", "--hallucination-silence-threshold", ""),
    (None, "without_timestamps", "--without-timestamps", ""),
    (None, "max_initial_timestamp", None, "fixed at the reference default (1.0 s)"),
    (None, "max_new_tokens", "--max-new-tokens", ""),
    (None, "hotwords", "--hotwords", ""),
    (None, "multilingual", None, "not served: language is detected once per file"),
    (None, "vad_filter / vad_parameters", None, "not served yet by oasr transcribe"),
    (None, "BatchedInferencePipeline(model).transcribe(batch_size=N)", "--batched", "with --batch-size N (default "
     "16; faster-whisper's 8): the chunks decoded together"),
    (None, "chunk_length", None, "not served: Whisper's window is the model's 30 s"),
    (None, "language_detection_threshold", None, "not served: the first window decides the language"),
    (None, "language_detection_segments", None, "not served: the first window decides the language"),
)


def add_flags(group: argparse._ArgumentGroup) -> None:
    """Add every decoding flag, with openai-whisper's underscore spelling as a hidden alias."""
    for flag in FLAGS:
        default_text = "" if flag.reference_default is None else f" (reference default: {_show(flag.reference_default)})"
        if flag.boolean:
            group.add_argument(f"--{flag.name}", dest=flag.field, default=None, action=argparse.BooleanOptionalAction,
                               help=flag.help + default_text)
            if "-" in flag.name:
                group.add_argument(f"--{flag.name.replace('-', '_')}", dest=flag.field, type=str2bool, default=None,
                                   metavar="BOOL", help=argparse.SUPPRESS)
            continue
        kwargs: dict[str, Any] = {"dest": flag.field, "default": None, "type": flag.type, "metavar": flag.metavar}
        if flag.field == "hotwords":
            kwargs["action"] = "append"
        group.add_argument(f"--{flag.name}", help=flag.help + default_text, **kwargs)
        if "-" in flag.name:
            group.add_argument(f"--{flag.name.replace('-', '_')}", help=argparse.SUPPRESS, **kwargs)


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def temperature_schedule(start: float, increment: float | None) -> tuple[float, ...]:
    """openai-whisper's schedule: ``start, start+increment, ...`` while below 1.0 (+1e-6); ``start``
    alone when the increment is None."""
    if increment is None:
        return (start,)
    if increment <= 0:
        raise ValueError(f"--temperature-increment-on-fallback must be > 0 or None, got {increment}")
    out, i = [], 0
    while start + i * increment < 1.0 + 1e-6:
        out.append(round(start + i * increment, 6))
        i += 1
    return tuple(out) or (start,)


def route(values: dict[str, Any], request_fields: set[str], supported: set[str], engine_fields: set[str],
          method: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split flag values into (per-request DecodingOptions kwargs, engine-level decode options).

    ``values`` maps field → value for every flag the user set; a field neither the request (among
    the strategy's ``supported`` options) nor the strategy's options class takes is refused.
    """
    from oasr.errors import RequestError

    request: dict[str, Any] = {}
    engine: dict[str, Any] = {}
    for field, value in values.items():
        if field in request_fields and field in supported:
            request[field] = value
        elif field in engine_fields:
            engine[field] = value
        else:
            flag = next((f"--{f.name}" for f in FLAGS if f.field == field), f"--{field.replace('_', '-')}")
            raise RequestError(f"{flag} is not served by decode method {method!r} of this model "
                               f"(it takes: {', '.join(sorted((supported & request_fields) | engine_fields))})",
                               param=field)
    return request, engine
