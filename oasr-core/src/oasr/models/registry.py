"""The model registry: architecture name → model class, config class and converter.

Families register through the ``oasr_register_models`` hook with ``"module:Class"`` strings, so
:func:`list_models` imports no family's model code; a class is imported when a model is built.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from oasr import plugins
from oasr.errors import AmbiguousCheckpointError, CheckpointFormatError, UnknownModelError
from oasr.models.base import BaseAsrModel, BaseModelConfig

if TYPE_CHECKING:
    from oasr.checkpoints.converter import CheckpointConverter


@attrs.frozen
class ModelInfo:
    """A registered architecture as ``oasr models`` shows it (no import needed)."""

    name: str
    model: str
    config: str
    converter: str | None
    distribution: str
    description: str


def register_model(
    name: str,
    model: str | type[BaseAsrModel],
    config: str | type[BaseModelConfig],
    converter: str | type[CheckpointConverter] | None = None,
    *,
    description: str = "",
    distribution: str = "<runtime>",
) -> None:
    """Register an architecture in-process (plugins use the ``oasr_register_models`` hook instead)."""
    plugins.registry("models").add(
        name, model, distribution=distribution, config=config, converter=converter, description=description
    )


def unregister_model(name: str) -> None:
    plugins.registry("models").remove(name)


def list_models() -> list[str]:
    """The registered architecture names, including out-of-tree ones from entry points."""
    return plugins.registry("models").names()


def model_infos() -> list[ModelInfo]:
    out = []
    for entry in plugins.registry("models"):
        def name_of(target) -> str | None:
            if target is None or isinstance(target, str):
                return target
            return f"{target.__module__}:{target.__qualname__}"

        out.append(ModelInfo(entry.name, name_of(entry.target), name_of(entry.meta["config"]),
                             name_of(entry.meta.get("converter")), entry.distribution,
                             entry.meta.get("description", "")))
    return sorted(out, key=lambda i: i.name)


def _entry(name: str) -> plugins.Entry:
    models = plugins.registry("models")
    if name not in models:
        raise UnknownModelError(
            f"model architecture {name!r} is not registered; registered: "
            f"{', '.join(models.names()) or '(none)'}{plugins.failed_plugins_hint()}. "
            f"Install the distribution that provides it (for example oasr-models-hf).",
            name=name,
        )
    return models.get(name)


def model_class(name: str) -> type[BaseAsrModel]:
    return _entry(name).load()


def config_class(name: str) -> type[BaseModelConfig]:
    return _entry(name).load_meta("config")


def converter_for(name: str) -> CheckpointConverter:
    entry = _entry(name)
    cls = entry.load_meta("converter")
    if cls is None:
        raise CheckpointFormatError(
            f"architecture {name!r} has no checkpoint converter; load it from a native bundle instead"
        )
    return cls()


def detect_architecture(path: str | Path) -> str:
    """Rank every converter's claim on ``path``; the most specific single claim wins."""
    path = Path(path)
    claims: list[tuple[int, str]] = []
    for entry in plugins.registry("models"):
        if entry.meta.get("converter") is None:
            continue
        try:
            converter = entry.load_meta("converter")()
        except Exception as exc:  # a converter that cannot import is reported, not fatal to others
            import warnings

            warnings.warn(f"converter of {entry.name!r} ({entry.distribution}) failed to import: {exc}",
                          RuntimeWarning, stacklevel=2)
            continue
        if path.is_file() and path.suffix not in converter.source_file_suffixes:
            continue  # a single-file source is asked only of the converters that read files of its kind
        if converter.detect(path):
            claims.append((int(converter.detect_specificity), entry.name))
    if not claims:
        names = ", ".join(list_models()) or "(none)"
        raise CheckpointFormatError(
            f"no converter recognizes {path}: looked for a native oasr_config.json and asked the converters "
            f"of {names}; none found its format markers (config.json with a known model_type, train.yaml, "
            f"config.yaml, tokens.txt beside *.pt, ...). Pass architecture= to force one.",
            path=path,
        )
    top = max(level for level, _ in claims)
    winners = sorted(name for level, name in claims if level == top)
    if len(winners) > 1:
        raise AmbiguousCheckpointError(
            f"{path} is claimed equally (specificity {top}) by {', '.join(winners)}; pass architecture= to choose",
            path=path,
            candidates=tuple(winners),
        )
    return winners[0]
