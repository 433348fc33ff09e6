"""Which distribution reads a checkpoint directory that no installed converter recognizes.

A converter can only claim a directory when its distribution is installed and loaded, so core keeps a
small table of the checkpoint layouts that OASR's own family distributions read, recognised by their
marker files alone (no family code is imported, no weights are read). When detection finds no
converter, :func:`install_hint` turns the markers into the fix: the distribution and its
``oasr-core`` extra, or why an installed one did not load (``OASR_PLUGINS``, an import error).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import attrs


def _any(path: Path, pattern: str) -> bool:
    return next(path.glob(pattern), None) is not None


def _json_field(file: Path, key: str) -> str | None:
    """``key`` of the JSON object in ``file`` when it is a string (None for anything unreadable)."""
    if not file.is_file() or file.stat().st_size > 1 << 20:
        return None
    try:
        value = json.loads(file.read_text(encoding="utf-8")).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def _wenet(path: Path) -> str | None:
    if (path / "train.yaml").is_file() and ((path / "final.pt").is_file() or _any(path, "*.pt")):
        return "a WeNet release directory (train.yaml beside final.pt)"
    return None


def _icefall(path: Path) -> str | None:
    if _any(path, "exp/*.pt") and _any(path, "data/lang_*"):
        return "an icefall release directory (exp/*.pt with data/lang_*)"
    return None


def _hf(path: Path) -> str | None:
    model_type = _json_field(path / "config.json", "model_type")
    if model_type is not None:
        return f"a Hugging Face checkpoint (config.json with model_type {model_type!r})"
    if (path / "config.json").is_file() and (path / "model.bin").is_file():
        return "a CTranslate2 (faster-whisper) directory (model.bin beside config.json)"
    return None


def _funasr(path: Path) -> str | None:
    if (path / "model.pt").is_file() and ((path / "config.yaml").is_file() or (path / "configuration.json").is_file()):
        return "a FunASR model directory (config.yaml or configuration.json beside model.pt)"
    return None


@attrs.frozen
class FamilyLayout:
    """A checkpoint layout and the distribution (and ``oasr-core`` extra) whose converters read it."""

    distribution: str
    extra: str
    #: the layout's description when ``path`` shows its markers, else None
    markers: Callable[[Path], str | None]


LAYOUTS: tuple[FamilyLayout, ...] = (
    FamilyLayout("oasr-models-wenet", "wenet", _wenet),
    FamilyLayout("oasr-models-icefall", "icefall", _icefall),
    FamilyLayout("oasr-models-funasr", "funasr", _funasr),
    FamilyLayout("oasr-models-hf", "hf", _hf),
)


def _installed(distribution: str) -> bool:
    try:
        metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


def _why_not_read(layout: FamilyLayout) -> str:
    """Why ``layout``'s distribution did not claim the directory, ending in the fix."""
    from oasr import plugins

    dist = layout.distribution
    records = [r for r in plugins.plugin_records() if r.distribution == dist]
    failed = [r.error for r in records if r.error]
    if failed:
        return f"{dist} is installed but failed to load ({'; '.join(failed)}); see 'oasr plugins'"
    if records:
        return f"{dist} is loaded, but none of its converters reads this checkpoint"
    if _installed(dist):
        allowed = os.environ.get("OASR_PLUGINS")
        if allowed is not None:
            return f"{dist} is installed but not loaded: OASR_PLUGINS={allowed!r} does not list it"
        return f"{dist} is installed but registers no plugin; reinstall it"
    return (f"{dist} is not installed: pip install \"oasr-core[{layout.extra}]\" "
            f"(in a checkout: pip install -e ./{dist})")


def install_hint(path: Path) -> str | None:
    """The refusal for a directory no converter claimed: what it looks like and what to install (or enable)
    to read it; None when no known layout's markers are there."""
    path = Path(path)
    for layout in LAYOUTS:
        described = layout.markers(path)
        if described is not None:
            return (f"no installed converter recognizes {path}: it looks like {described}, which "
                    f"{layout.distribution} reads; {_why_not_read(layout)}")
    return None
