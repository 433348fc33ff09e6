"""Reading checkpoint files safely: paths that stay inside the model, and library errors as OasrErrors.

A model directory may contain symbolic links only where they stay within the model:

- links whose target lies inside the directory itself;
- in a Hugging Face hub cache snapshot (``…/models--owner--name/snapshots/<revision>/…``), links into
  that repository's own ``blobs/`` folder — the layout ``huggingface_hub`` writes for every download.

Any other link (to ``/etc/passwd``, to another repository of the cache) is refused with an error that
names the link inside the model, never where it points.  :func:`check_links` applies the rule to a
whole directory before any converter reads it; :func:`resolve_inside` applies it to one name.

:func:`load_safetensors` turns the safetensors library's errors (a bad header, a truncated file) into
a :class:`~oasr.errors.CheckpointFormatError` naming the file.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from oasr.errors import CheckpointFormatError

#: hub cache folder prefixes of a repository (huggingface_hub's ``repo_folder_name``)
HUB_REPO_PREFIXES = ("models--", "datasets--", "spaces--")
#: :func:`check_links` looks this many directory levels deep and at this many entries at most
SCAN_DEPTH, SCAN_ENTRIES = 4, 20000


def _hub_blobs(root: Path) -> Path | None:
    """The ``blobs/`` folder of the hub cache repository ``root`` is a snapshot of (or lies in)."""
    for folder in (root, *root.parents):
        if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith(HUB_REPO_PREFIXES):
            return folder.parent.parent / "blobs"
    return None


def allowed_roots(root: Path) -> tuple[Path, ...]:
    """Where files of the model at ``root`` may really live (see the module docstring)."""
    root = Path(root).absolute()
    blobs = _hub_blobs(root)
    roots = [root.resolve()]
    if blobs is not None:
        roots.append(blobs.resolve())
    return tuple(roots)


def _refuse(root: Path, name: str | os.PathLike) -> CheckpointFormatError:
    return CheckpointFormatError(
        f"{Path(root) / name}: this path leads outside the model directory {root} (a symbolic link or '..' "
        f"pointing elsewhere); refusing to follow it. Copy the file into the model directory instead.",
        path=Path(root) / name)


def resolve_inside(root: str | os.PathLike, name: str | os.PathLike) -> Path:
    """``root/name`` resolved, refusing a name or link that leads outside the model (see the module docstring)."""
    root = Path(root)
    if Path(name).is_absolute():
        raise CheckpointFormatError(f"{name!r} is an absolute path; a model's files are named relative to "
                                    f"its directory {root}", path=root)
    target = (root.absolute() / name).resolve()
    if not any(target.is_relative_to(allowed) for allowed in allowed_roots(root)):
        raise _refuse(root, name)
    return target


def check_links(root: str | os.PathLike) -> None:
    """Refuse a model directory holding a symbolic link that leads outside the model."""
    root = Path(root)
    allowed = allowed_roots(root)
    seen = 0
    base_depth = len(root.absolute().parts)
    for folder, dirs, files in os.walk(root):
        depth = len(Path(folder).absolute().parts) - base_depth
        for name in (*dirs, *files):
            seen += 1
            entry = Path(folder) / name
            if entry.is_symlink():
                target = entry.resolve()
                if not any(target.is_relative_to(a) for a in allowed):
                    raise _refuse(root, entry.relative_to(root))
        if depth >= SCAN_DEPTH or seen >= SCAN_ENTRIES:
            dirs.clear()


def load_safetensors(path: str | os.PathLike, *, device: str = "cpu") -> dict[str, torch.Tensor]:
    """All tensors of a ``.safetensors`` file; a corrupt or unreadable file is a CheckpointFormatError."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    try:
        return load_file(str(path), device=device)
    except FileNotFoundError:
        raise CheckpointFormatError(f"weights file {path} does not exist", path=path) from None
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise CheckpointFormatError(f"weights file {path} is not a readable safetensors file (corrupt or "
                                    f"truncated?): {type(exc).__name__}: {exc}", path=path) from None
