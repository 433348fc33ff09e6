"""The ``oasr`` command line: ``models``, ``plugins``, ``convert``, ``transcribe``, ``serve``."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable
from typing import Any

# subcommand → (module, help); each module has add_arguments(parser) and run(args) -> int
COMMANDS: dict[str, tuple[str, str]] = {
    "transcribe": ("oasr.transcribe_cli", "transcribe audio files with a model"),
    "serve": ("oasr.serve.cli", "run the OpenAI-compatible HTTP/WebSocket server"),
    "convert": ("oasr.checkpoints.convert", "convert a checkpoint to a native bundle"),
    "models": ("oasr.cli", "list registered model architectures and aliases"),
    "plugins": ("oasr.cli", "list plugins, what they registered and load errors"),
    "download": ("oasr.cli", "fetch a model (alias or hub id) into the local cache ahead of use"),
}


#: top-level module of an optional dependency → the oasr-core extra that installs it
EXTRAS: dict[str, str] = {
    "fastapi": "serve", "uvicorn": "serve", "multipart": "serve", "python_multipart": "serve",
    "prometheus_client": "serve", "websockets": "serve", "starlette": "serve",
    "oasr_models_hf": "hf", "oasr_models_wenet": "wenet", "oasr_models_icefall": "icefall",
    "oasr_models_funasr": "funasr", "oasr_kernels": "kernels", "numba": "kernels",
}


def missing_extra_message(exc: ModuleNotFoundError) -> str | None:
    """One line naming the extra that provides a missing optional module (None: not an optional one)."""
    top = (exc.name or "").split(".")[0]
    extra = EXTRAS.get(top)
    if extra is None:
        return None
    return (f"this command needs {top!r}, which is not installed: pip install \"oasr-core[{extra}]\" "
            f"(in a checkout: pip install -e \"./oasr-core[{extra}]\")")


def run_guarded(fn: Callable[[], int]) -> int:
    """Run a command, turning an OasrError (or a missing optional dependency) into one clear line on
    stderr and exit status 2."""
    from oasr.errors import OasrError

    try:
        return fn()
    except OasrError as exc:
        print(f"oasr: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        message = missing_extra_message(exc)
        if message is None:
            raise
        print(f"oasr: error: {message}", file=sys.stderr)
        return 2
    except (FileExistsError, FileNotFoundError) as exc:
        print(f"oasr: error: {exc}", file=sys.stderr)
        return 2


def resolve_device(device: str) -> str:
    """``auto``: CUDA when torch sees a GPU, else CPU; an explicit device must exist (ConfigError)."""
    import torch

    from oasr.errors import ConfigError

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError):
        raise ConfigError(f"--device {device!r} is not a device; use auto, cpu, cuda or cuda:N", key="device") from None
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            build = "a CPU-only build" if torch.version.cuda is None else "a CUDA build that sees no GPU"
            raise ConfigError(f"--device {device}: CUDA is not available (torch {torch.__version__} is {build}); "
                              f"use --device cpu or auto", key="device")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise ConfigError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) are visible",
                              key="device")
    elif parsed.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"--device {device}: MPS is not available on this machine; use --device cpu", key="device")
    return device


def set_model_dir(path: str) -> None:
    """Make hub downloads (and cache look-ups) use ``path`` as the huggingface_hub cache."""
    os.environ["HF_HUB_CACHE"] = str(path)
    if "huggingface_hub" in sys.modules:
        from huggingface_hub import constants

        constants.HF_HUB_CACHE = str(path)


def parse_key_values(pairs: list[str], flag: str) -> dict[str, Any]:
    """``KEY=VALUE`` pairs as a dict, each VALUE parsed as JSON when it is JSON (else kept as text)."""
    from oasr.errors import ConfigError

    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"{flag} expects KEY=VALUE, got {pair!r}", key=flag.lstrip("-").replace("-", "_"))
        try:
            options[key] = json.loads(raw)
        except json.JSONDecodeError:
            options[key] = raw
    return options


def _table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(header, widths, strict=False)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=False)).rstrip() for r in rows]
    return "\n".join(lines)


def _table_with_errors(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    """``_table`` whose last column (an import error per row) is shown only when some row has one."""
    if any(row[-1] for row in rows):
        return _table(rows, header)
    return _table([row[:-1] for row in rows], header[:-1])


def models_command(args: argparse.Namespace) -> int:
    from oasr import plugins
    from oasr.models.registry import model_infos

    rows = []
    for info in model_infos():
        entry = plugins.registry("models").get(info.name)
        error = entry.import_error()
        converter = "error" if error else "yes" if info.converter else "no"
        rows.append((info.name, info.distribution, converter, info.description, error or ""))
    print(_table_with_errors(rows, ("architecture", "distribution", "converter", "description", "error")))
    aliases = list(plugins.registry("aliases"))
    if aliases:
        print()
        rows = [(a.name, a.distribution, a.meta.get("description", ""), a.import_error() or "") for a in aliases]
        print(_table_with_errors(rows, ("alias", "distribution", "description", "error")))
    failed = [r for r in plugins.plugin_records() if r.error]
    if failed:
        print()
        print(_table([(r.name, r.distribution, r.error or "") for r in failed],
                     ("plugin not loaded", "distribution", "error")))
    return 0


def plugins_command(args: argparse.Namespace) -> int:
    from oasr import plugins

    rows, broken = [], False
    for r in plugins.plugin_records():
        registered = ", ".join(f"{plugins.LABELS[kind]}:{name}" for kind, name in r.registered) or "-"
        problems = [*(note for _kind, _name, note in r.clashes), *([r.error] if r.error else []),
                    *plugins.import_problems(r)]
        broken = broken or bool(r.error) or len(problems) > len(r.clashes)
        rows.append((r.name, r.distribution, r.version, r.group, registered, "; ".join(problems)))
    print(_table(rows, ("plugin", "distribution", "version", "group", "registered", "error")))
    return 1 if args.strict and broken else 0


def download_command(args: argparse.Namespace) -> int:
    from oasr.checkpoints.loading import resolve_source

    if args.model_dir:
        set_model_dir(args.model_dir)
    print(resolve_source(args.model))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from oasr import __version__

    parser = argparse.ArgumentParser(prog="oasr", description="OASR: speech recognition inference and serving")
    parser.add_argument("--version", action="version", version=f"oasr {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (module, help_text) in COMMANDS.items():
        if name == "models":
            p = sub.add_parser(name, help=help_text, description=help_text)
            p.set_defaults(func=models_command)
        elif name == "plugins":
            p = sub.add_parser(name, help=help_text, description=help_text)
            p.add_argument("--strict", action="store_true", help="exit 1 if any plugin failed to load")
            p.set_defaults(func=plugins_command)
        elif name == "download":
            p = sub.add_parser(name, help=help_text, description=help_text)
            p.add_argument("model", help="alias (see 'oasr models': tiny, base, large-v3, turbo, ...) or hub id")
            p.add_argument("--model-dir", default=None, metavar="DIR",
                           help="cache directory (default: huggingface_hub's cache)")
            p.set_defaults(func=download_command)
        else:
            try:
                mod = importlib.import_module(module)
            except ModuleNotFoundError as exc:  # a command whose module is not built yet
                if not module.startswith(exc.name or "\0"):
                    raise
                continue
            p = sub.add_parser(name, help=help_text, description=help_text)
            mod.add_arguments(p)
            p.set_defaults(func=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return run_guarded(lambda: args.func(args))


if __name__ == "__main__":
    sys.exit(main())
