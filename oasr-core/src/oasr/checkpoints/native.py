"""The native bundle: OASR's own checkpoint format.

::

    dst/
    ├── oasr_config.json   format_version 1: architecture, model config, tokenizer/feature/decoding specs
    ├── model.safetensors  the post-load_weights state dict (computed buffers left out, rebuilt at load)
    └── tokenizer/         tokenizer assets copied verbatim

Compatibility promise: a reader accepts every ``format_version`` up to :data:`FORMAT_VERSION`
(version 2 adds a ``quantization`` section) and refuses newer ones with a message saying so.
Loading needs no third-party framework, is strict (every model tensor from the file, nothing left
over), reads on the host and casts dtype before any device move.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import attrs
import torch
from safetensors.torch import save_file

from oasr import serde
from oasr.checkpoints.files import load_safetensors, resolve_inside
from oasr.checkpoints.loaded import NATIVE_CONFIG, LoadedModel, finish_model
from oasr.errors import CheckpointFormatError, ConfigError
from oasr.models.registry import config_class, model_class
from oasr.models.specs import DecodingDefaults, FeatureSpec, LoadReport, TokenizerSpec

FORMAT_VERSION = 2
WEIGHTS = "model.safetensors"
TOKENIZER_DIR = "tokenizer"


@attrs.define
class NativeConfig:
    """The schema of ``oasr_config.json``."""

    format_version: int
    architecture: str
    model_config: dict[str, Any]
    tokenizer: TokenizerSpec
    features: FeatureSpec
    decoding: DecodingDefaults
    quantization: dict[str, Any] | None = None
    oasr_version: str = ""


def is_native_bundle(path: Path) -> bool:
    return (Path(path) / NATIVE_CONFIG).is_file()


def _inside(root: Path, name: str) -> Path:
    """``root/name``, refusing names that escape ``root`` (see :func:`oasr.checkpoints.files.resolve_inside`)."""
    return resolve_inside(root, name)


def save_native(loaded: LoadedModel, dst: str | Path, *, overwrite: bool = False) -> Path:
    """Write ``loaded`` as a native bundle at ``dst``."""
    from oasr import __version__

    dst = Path(dst)
    if dst.exists() and any(dst.iterdir()) and not overwrite:
        raise FileExistsError(f"{dst} exists and is not empty; pass overwrite=True (or --force)")
    dst.mkdir(parents=True, exist_ok=True)

    files: dict[str, str] = {}
    tok_dir = dst / TOKENIZER_DIR
    for role, name in loaded.tokenizer_spec.files.items():
        src = Path(name) if Path(name).is_absolute() else loaded.tokenizer_root / name
        if not src.is_file():
            raise CheckpointFormatError(f"tokenizer file {src} (role {role!r}) does not exist", path=src)
        tok_dir.mkdir(exist_ok=True)
        target = tok_dir / src.name
        if target.exists() and not target.samefile(src) and target.read_bytes() != src.read_bytes():
            target = tok_dir / f"{role}_{src.name}"
        if not target.exists():
            shutil.copyfile(src, target)
        files[role] = target.name
    tokenizer = attrs.evolve(loaded.tokenizer_spec, files=files)

    model = loaded.model
    state = {k: v.detach().to("cpu").contiguous().clone() for k, v in model.native_state_dict().items()}
    quant = loaded.quantization
    config = NativeConfig(
        format_version=2 if quant else 1,
        architecture=loaded.architecture,
        model_config=serde.unstructure(loaded.config),
        tokenizer=tokenizer,
        features=loaded.feature_spec,
        decoding=loaded.decoding_defaults,
        quantization=quant,
        oasr_version=__version__,
    )
    save_file(state, str(dst / WEIGHTS), metadata={"format": "pt", "architecture": loaded.architecture})
    (dst / NATIVE_CONFIG).write_text(serde.dumps(config))
    return dst


def read_native_config(path: Path) -> NativeConfig:
    cfg_path = Path(path) / NATIVE_CONFIG
    try:
        raw = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointFormatError(f"{cfg_path} is not valid JSON: {exc}", path=cfg_path) from exc
    version = raw.get("format_version") if isinstance(raw, dict) else None
    if not isinstance(version, int) or version < 1:
        raise CheckpointFormatError(f"{cfg_path}: format_version must be a positive integer, got {version!r}",
                                    path=cfg_path)
    if version > FORMAT_VERSION:
        raise CheckpointFormatError(
            f"{cfg_path} is format_version {version}; this OASR reads up to {FORMAT_VERSION}. Upgrade oasr-core.",
            path=cfg_path,
        )
    try:
        return serde.structure(raw, NativeConfig, what=str(cfg_path))
    except ConfigError as exc:
        raise CheckpointFormatError(str(exc), path=cfg_path) from exc


def load_native(path: str | Path, *, device: str | torch.device = "cpu",
                dtype: str | torch.dtype | None = None) -> LoadedModel:
    path = Path(path)
    native = read_native_config(path)
    cls = model_class(native.architecture)
    try:
        config = serde.structure(native.model_config, config_class(native.architecture),
                                 what=f"{path / NATIVE_CONFIG} model_config")
    except ConfigError as exc:
        raise CheckpointFormatError(str(exc), path=path) from exc
    model = cls.from_config(config)
    quant = native.quantization
    if quant:
        from oasr.layers.quant import prepare_quantized

        prepare_quantized(model, quant)
    weights = path / WEIGHTS
    if not weights.is_file():
        raise CheckpointFormatError(f"native bundle {path} has no {WEIGHTS}", path=path)
    state = load_safetensors(weights)
    result = model.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if not model.is_computed_buffer(k)]
    if missing or result.unexpected_keys:
        raise CheckpointFormatError(
            f"native bundle {path} does not match architecture {native.architecture!r}: "
            f"missing {missing[:10]}, unexpected {list(result.unexpected_keys)[:10]}",
            path=path,
        )
    tokenizer_root = path / TOKENIZER_DIR
    for name in native.tokenizer.files.values():
        _inside(tokenizer_root, name)
    finish_model(model, device=device, dtype=dtype)
    return LoadedModel(
        model=model,
        architecture=native.architecture,
        config=config,
        tokenizer_spec=native.tokenizer,
        feature_spec=native.features,
        decoding_defaults=native.decoding,
        load_report=LoadReport(mapped=sorted(state), dropped=[], missing=[]),
        source=path,
        tokenizer_root=tokenizer_root,
        quantization=quant,
    )
