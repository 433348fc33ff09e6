"""``oasr convert SRC DST`` / ``oasr-convert``: any supported checkpoint → a native bundle."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def convert(src: str, dst: str | Path, *, architecture: str | None = None, overwrite: bool = False,
            quantization: str | None = None) -> Path:
    """Load ``src`` (directory, alias or hub id) and write it as a native bundle at ``dst``.

    ``quantization="int8"`` stores int8 weights (a format_version 2 bundle).
    """
    from oasr.checkpoints.loading import load_pretrained
    from oasr.checkpoints.native import save_native

    loaded = load_pretrained(src, architecture=architecture)
    if quantization == "int8" and not loaded.quantization:
        from oasr.layers.quant import quantize_model_int8

        loaded.quantization = quantize_model_int8(loaded.model)
    elif quantization not in (None, "int8"):
        raise ValueError(f"unknown quantization {quantization!r}; expected 'int8'")
    return save_native(loaded, dst, overwrite=overwrite)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("src", help="checkpoint directory, alias or Hugging Face Hub id")
    parser.add_argument("dst", help="output directory for the native bundle")
    parser.add_argument("--architecture", default=None, help="force an architecture instead of detecting one")
    parser.add_argument("--force", action="store_true", help="overwrite a non-empty output directory")
    parser.add_argument("--quantization", choices=("int8",), default=None,
                        help="store int8 weights (per output channel; activations quantized at run time)")


def run(args: argparse.Namespace) -> int:
    out = convert(args.src, args.dst, architecture=args.architecture, overwrite=args.force,
                  quantization=args.quantization)
    print(f"wrote native bundle {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="oasr-convert", description=__doc__)
    add_arguments(parser)
    from oasr.cli import run_guarded

    return run_guarded(lambda: run(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
