"""``oasr transcribe AUDIO...``: transcribe files, directories or glob patterns in-process."""

from __future__ import annotations

import argparse
import glob
import sys
from pathlib import Path

AUDIO_SUFFIXES = {".wav", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".m4a", ".mp4", ".aac", ".webm", ".mka",
                  ".mkv", ".wma", ".aiff", ".aif", ".au", ".caf"}
EXTENSIONS = {"text": "txt", "json": "json", "verbose_json": "json", "srt": "srt", "vtt": "vtt"}


def expand_inputs(patterns: list[str]) -> list[Path]:
    """Files named directly, audio files inside directories (recursively) and glob matches, in order."""
    out: list[Path] = []
    for pattern in patterns:
        path = Path(pattern)
        if path.is_dir():
            out.extend(sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in AUDIO_SUFFIXES))
        elif path.exists():
            out.append(path)
        elif glob.has_magic(pattern):
            matches = sorted(Path(p) for p in glob.glob(pattern, recursive=True) if Path(p).is_file())
            if not matches:
                raise FileNotFoundError(f"no file matches {pattern!r}")
            out.extend(matches)
        else:
            raise FileNotFoundError(f"{pattern}: no such file or directory")
    seen: set[Path] = set()
    return [p for p in out if not (p.resolve() in seen or seen.add(p.resolve()))]


#: the EngineConfig fields ``oasr transcribe`` takes as flags (see :mod:`oasr.engine.flags`)
ENGINE_FIELDS = ("model", "architecture", "device", "dtype", "quantization", "max_batch_size", "decode_method",
                 "num_threads")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from oasr.engine.flags import add_engine_flags
    from oasr.engine.formats import FORMATS

    parser.add_argument("audio", nargs="+", help="audio files, directories or glob patterns")
    parser.add_argument("-f", "--format", default="text", choices=FORMATS, help="output format")
    parser.add_argument("-o", "--output", default=None,
                        help="output directory (one file per input), or a file path for a single input")
    parser.add_argument("--word-timestamps", action="store_true", help="add word timings")
    parser.add_argument("--vad", "--vad-filter", dest="vad_filter", action="store_true",
                        help="decode only the speech a voice activity detector finds (faster-whisper's vad_filter; "
                             "needs oasr-core[vad])")
    parser.add_argument("--language", default=None, help="language code (models that take one)")
    parser.add_argument("--task", default="transcribe", choices=("transcribe", "translate"))
    parser.add_argument("--beam-size", type=int, default=None, help="beam width (default: the model's)")
    parser.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    add_engine_flags(parser.add_argument_group("engine"), ENGINE_FIELDS)


def _destination(output: str | None, source: Path, fmt: str, many: bool) -> Path | None:
    if output is None:
        return None
    out = Path(output)
    if not many and out.suffix and not out.is_dir():
        return out
    out.mkdir(parents=True, exist_ok=True)
    return out / f"{source.stem}.{EXTENSIONS[fmt]}"


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from oasr.engine import DecodingOptions, Engine, EngineConfig
    from oasr.engine.flags import engine_config_kwargs
    from oasr.engine.formats import render

    files = expand_inputs(args.audio)
    if not files:
        print("oasr: error: no audio files found", file=sys.stderr)
        return 2
    engine = Engine(EngineConfig(**engine_config_kwargs(args, ENGINE_FIELDS)))
    decoding_kwargs = {"word_timestamps": args.word_timestamps, "task": args.task}
    if args.vad_filter:
        decoding_kwargs["vad_filter"] = True
    if args.language:
        decoding_kwargs["language"] = args.language
    if args.beam_size:
        decoding_kwargs["beam_size"] = args.beam_size
    if args.format in ("srt", "vtt", "verbose_json") and "timestamps" in engine.strategy.supported_options:
        decoding_kwargs["timestamps"] = True
    decoding = DecodingOptions(**decoding_kwargs)
    many = len(files) > 1
    bar = tqdm(total=len(files), unit="file", disable=args.no_progress or not many, file=sys.stderr)
    try:
        outputs = engine.transcribe_outputs([str(f) for f in files], decoding=decoding,
                                            progress=lambda _out: bar.update(1))
    finally:
        bar.close()
    failures = 0
    for source, output in zip(files, outputs):
        if output.finish_reason == "error":
            failures += 1
            print(f"oasr: error: {source}: {output.error}", file=sys.stderr)
            continue
        text = render(output, args.format, task=args.task)
        dest = _destination(args.output, source, args.format, many)
        if dest is not None:
            dest.write_text(text, encoding="utf-8")
        elif many and args.format == "text":
            print(f"{source}: {text.strip()}")
        else:
            sys.stdout.write(text)
    if failures:
        print(f"oasr: {failures} of {len(files)} file(s) failed", file=sys.stderr)
    return 1 if failures else 0
