"""``oasr transcribe AUDIO...``: transcribe files, directories or glob patterns in-process.

The decoding flags and their openai-whisper / faster-whisper names are in :mod:`oasr.transcribe_flags`.
Each file's output is written as soon as it is decoded, so an interrupt (Ctrl-C) keeps every file that
finished.  With ``-o DIR`` the outputs mirror the input tree under ``DIR``; two inputs that would write
the same file keep their audio suffix in the name (``a.mp3.srt``, ``a.m4a.srt``), and an existing file
is replaced only with ``--overwrite``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from oasr.transcribe import ALL_FORMATS, build_engine, destinations, expand_inputs, subtitle_layout

#: the EngineConfig fields ``oasr transcribe`` takes as generated flags (type, choices and default are
#: the field's, see :mod:`oasr.engine.flags`); the model group's own flags come first
ENGINE_FIELDS = ("dtype", "quantization", "max_batch_size", "num_threads", "decode_method")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from oasr.engine.flags import add_engine_flags
    from oasr.engine.formats import CLI_FORMATS
    from oasr.transcribe_flags import add_flags, non_negative_float, optional_float, positive_int, str2bool

    parser.add_argument("audio", nargs="+", help="audio files, directories (searched recursively) or glob patterns")
    model = parser.add_argument_group("model")
    model.add_argument("--model", "-m", default=None,
                       help="checkpoint directory, alias (see 'oasr models') or hub id (default: the embedded default)")
    model.add_argument("--model-dir", default=None, metavar="DIR",
                       help="cache directory for models fetched from the hub (default: huggingface_hub's cache)")
    model.add_argument("--architecture", default=None, help="force an architecture instead of detecting one")
    model.add_argument("--device", default="auto",
                       help="cpu, cuda, cuda:N or auto (default: auto, CUDA when available, else CPU)")
    add_engine_flags(model, ENGINE_FIELDS[:-1])

    scale = parser.add_argument_group("scale-out on Ray Data (pip install \"oasr-core[ray]\"; see docs/ray.md)")
    scale.add_argument("--ray", action="store_true",
                       help="transcribe on Ray Data with --workers engines; needs -o DIR; files whose outputs "
                            "exist are skipped (a killed job resumes); inputs may also be manifests (.txt/.jsonl)")
    scale.add_argument("--workers", type=positive_int, default=2, help="engines in the Ray actor pool (default: 2)")
    scale.add_argument("--ray-address", default=None, help="a running Ray cluster to join (default: a local one)")

    out = parser.add_argument_group("output")
    out.add_argument("-f", "--format", "--output-format", dest="format", default="text",
                     choices=(*CLI_FORMATS, "all"),
                     help="output format (default: text); txt/tsv/all as openai-whisper (all: txt, vtt, srt, tsv "
                          "and verbose_json as .json)")
    out.add_argument("-o", "--output", "--output-dir", dest="output", default=None,
                     help="output directory (mirrors the input tree), or a file path for a single input "
                          "(default: standard output)")
    out.add_argument("--overwrite", action="store_true", help="replace output files that already exist")
    out.add_argument("--verbose", action=argparse.BooleanOptionalAction, default=False,
                     help="print each segment as it is final ([start --> end] text) on standard error "
                          "(openai-whisper's --verbose True)")
    out.add_argument("--no-progress", action="store_true", help="never show a progress bar")

    sub = parser.add_argument_group("subtitles (srt, vtt; the line options need --word-timestamps)")
    sub.add_argument("--max-line-width", type=positive_int, default=None, metavar="N",
                     help="characters per line before it breaks")
    sub.add_argument("--max-line-count", type=positive_int, default=None, metavar="N",
                     help="lines per subtitle")
    sub.add_argument("--max-words-per-line", type=positive_int, default=None, metavar="N",
                     help="words per line (no effect with --max-line-width)")
    sub.add_argument("--highlight-words", action=argparse.BooleanOptionalAction, default=False,
                     help="underline each word as it is spoken")
    sub.add_argument("--highlight_words", dest="highlight_words", type=str2bool, help=argparse.SUPPRESS)

    dec = parser.add_argument_group("decoding (default: the reference's, openai-whisper's transcribe() for "
                                    "Whisper; see docs/cli.md)")
    dec.add_argument("--language", default=None, help="language code (default: detected, on models that detect it)")
    dec.add_argument("--task", default=None, choices=("transcribe", "translate"),
                     help="transcribe (default) or translate into English (multilingual models)")
    dec.add_argument("--word-timestamps", action=argparse.BooleanOptionalAction, default=None,
                     help="time each word")
    dec.add_argument("--word_timestamps", dest="word_timestamps", type=str2bool, help=argparse.SUPPRESS)
    dec.add_argument("--temperature", type=non_negative_float, default=None, metavar="T",
                     help="sampling temperature of the first try (reference default: 0)")
    dec.add_argument("--temperature-increment-on-fallback", type=optional_float, default=0.2, metavar="X",
                     help="raise the temperature by this on each fallback up to 1.0 (None: no fallback; "
                          "reference default: 0.2)")
    dec.add_argument("--vad", "--vad-filter", dest="vad_filter", action="store_true",
                     help="decode only the speech a voice activity detector finds (faster-whisper's vad_filter; "
                          "needs oasr-core[vad])")
    add_flags(dec)
    _underscore_aliases(parser)
    add_engine_flags(dec, ENGINE_FIELDS[-1:])
    dec.add_argument("--decode-option", action="append", default=[], metavar="KEY=VALUE",
                     help="engine-level option of the decode strategy (VALUE parsed as JSON when it is JSON); "
                          "repeatable")


def _underscore_aliases(parser: argparse.ArgumentParser) -> None:
    """openai-whisper's spellings (``--output_dir``, ``--max_line_width`` ...) as hidden aliases."""
    for action in list(parser._actions):
        long = [o for o in action.option_strings if o.startswith("--") and "-" in o[2:]]
        alias = long[0].replace("-", "_").replace("__", "--", 1) if long else None
        if alias is None or alias in parser._option_string_actions or isinstance(
                action, (argparse.BooleanOptionalAction, argparse._StoreTrueAction, argparse._AppendAction)):
            continue
        parser.add_argument(alias, dest=action.dest, type=action.type, choices=action.choices,
                            default=argparse.SUPPRESS, metavar=action.metavar, help=argparse.SUPPRESS)


def _fail(message: str) -> int:
    print(f"oasr: error: {message}", file=sys.stderr)
    return 2


def _print_segments(source: Path, segments, many: bool) -> None:
    from oasr.engine.formats import _timestamp

    for seg in segments:
        label = f"{source}: " if many else ""
        print(f"{label}[{_timestamp(seg.start, decimal='.')} --> {_timestamp(seg.end, decimal='.')}] "
              f"{seg.text.strip()}", file=sys.stderr, flush=True)


def _stdout_block(source: Path, text: str, fmt: str, many: bool) -> str:
    if not many:
        return text
    if fmt == "text":
        return f"{source}: {text.strip()}\n"
    if fmt in ("json", "verbose_json"):
        return json.dumps({"file": str(source), **json.loads(text)}, ensure_ascii=False) + "\n"
    return f"==> {source} <==\n{text}\n"


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from oasr.engine.formats import render
    from oasr.errors import OasrError

    formats = ALL_FORMATS if args.format == "all" else (args.format,)
    if args.ray:
        if args.output is None:
            return _fail("--ray writes one file per input: give an output directory with -o")
        from oasr.ray.data import run_cli

        return run_cli(args, formats)
    files = expand_inputs(args.audio)
    if not files:
        return _fail("no audio files found")
    if args.format == "all" and args.output is None:
        return _fail("-f all writes one file per format: give an output directory with -o")
    dests = destinations(args.output, files, formats, args.overwrite)
    engine, decoding = build_engine(args)
    layout = subtitle_layout(args)
    many = len(files) > 1
    state = {"failures": 0, "written": 0, "next": 0}
    #: per input: audio seconds already counted on the bar, segments already printed (--verbose)
    counted: dict[int, float] = {}
    printed: dict[int, int] = {}

    def advance(seconds: float) -> None:
        """Move the bar by ``seconds`` of audio, never past its total (tqdm warns beyond it)."""
        bar.update(max(0.0, min(seconds, bar.total - bar.n)))

    def window(index: int, segments, seconds_done: float) -> None:
        """A window of ``index`` is decoded: advance the bar, print its segments as they are final."""
        advance(seconds_done - counted.get(index, 0.0))
        counted[index] = seconds_done
        if args.verbose:
            _print_segments(files[index][0], [s for s in segments if s.text.strip()], many)
            printed[index] = printed.get(index, 0) + len(segments)
    done: dict[int, str] = {}

    def finish(index: int, output) -> None:
        source = files[index][0]
        advance((output.duration or 0.0) - counted.get(index, 0.0))
        if output.finish_reason == "error":
            state["failures"] += 1
            bar.write(f"oasr: error: {source}: {output.error}", file=sys.stderr)
            done[index] = ""
        else:
            if args.verbose:
                _print_segments(source, (output.segments or [])[printed.get(index, 0):], many)
            texts = [render(output, fmt, task=decoding.task, layout=layout) for fmt in formats]
            if dests is not None:
                for path, text in zip(dests[index], texts, strict=True):
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(text, encoding="utf-8")
                done[index] = ""
            else:
                done[index] = _stdout_block(source, texts[0], args.format, many)
            state["written"] += 1
        while state["next"] in done:  # standard output keeps input order
            sys.stdout.write(done.pop(state["next"]))
            sys.stdout.flush()
            state["next"] += 1

    loaded: list[Any] = []
    for source, _ in files:
        try:
            loaded.append(engine.load_audio(str(source), None))
        except OasrError as exc:
            loaded.append(exc)
    total = sum(len(x) for x in loaded if not isinstance(x, OasrError)) / engine.sample_rate
    with tqdm(total=total, unit="s", disable=args.no_progress or args.verbose, file=sys.stderr,
              bar_format="{l_bar}{bar}| {n:.1f}/{total:.1f} audio s [{elapsed}<{remaining}]") as bar:
        try:
            for index, samples in enumerate(loaded):
                try:
                    if isinstance(samples, OasrError):
                        raise samples
                    engine.add_request(samples, sample_rate=engine.sample_rate, decoding=decoding,
                                       callback=lambda out, i=index: finish(i, out),
                                       on_segments=lambda segs, done, _lang, i=index: window(i, segs, done))
                except OasrError as exc:
                    from oasr.engine.options import RequestOutput

                    finish(index, RequestOutput(str(index), finished=True, finish_reason="error", error=str(exc)))
            engine.run()
        except KeyboardInterrupt:
            bar.close()
            print(f"oasr: interrupted: {state['written']} of {len(files)} file(s) finished and written",
                  file=sys.stderr)
            return 130
    if state["failures"]:
        print(f"oasr: {state['failures']} of {len(files)} file(s) failed", file=sys.stderr)
    return 1 if state["failures"] else 0
