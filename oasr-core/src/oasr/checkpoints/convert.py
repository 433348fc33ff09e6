"""``oasr convert SRC DST`` / ``oasr-convert``: any supported checkpoint → a native bundle."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def convert(src: str, dst: str | Path, *, architecture: str | None = None, overwrite: bool = False) -> Path:
    """Load ``src`` (directory, alias or hub id) and write it as a native bundle at ``dst``."""
    from oasr.checkpoints.native import save_native
    from oasr.models.loading import load_pretrained

    loaded = load_pretrained(src, architecture=architecture)
    return save_native(loaded, dst, overwrite=overwrite)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("src", help="checkpoint directory, alias or Hugging Face Hub id")
    parser.add_argument("dst", help="output directory for the native bundle")
    parser.add_argument("--architecture", default=None, help="force an architecture instead of detecting one")
    parser.add_argument("--force", action="store_true", help="overwrite a non-empty output directory")


def run(args: argparse.Namespace) -> int:
    out = convert(args.src, args.dst, architecture=args.architecture, overwrite=args.force)
    print(f"wrote native bundle {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="oasr-convert", description=__doc__)
    add_arguments(parser)
    from oasr.cli import run_guarded

    return run_guarded(lambda: run(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
