"""Reading NeMo's ``.nemo`` archives safely: the config, the weights and the tokenizer files.

A ``.nemo`` file is a tar archive (plain or gzip) that NeMo's ``save_to()`` writes with
``model_config.yaml``, ``model_weights.ckpt`` (a ``torch.save`` state dict) and the tokenizer's files,
whose names the config's ``tokenizer`` section gives as ``nemo:<member name>``.

Safety rules, checked before anything is read:

- every member's name stays inside the archive root (no absolute names, no ``..``), and so does every
  link target; device files and FIFOs are refused;
- at most :data:`MAX_MEMBERS` members; a small file (config, tokenizer) is at most :data:`MAX_SMALL_BYTES`,
  the weights at most :data:`MAX_WEIGHTS_BYTES`;
- only regular files are ever read, and only the ones named above; the small ones are copied by name
  into a private extraction directory (validated by ``tarfile``'s own ``data`` filter as well), the
  weights are unpickled straight from the archive with ``torch.load(weights_only=True)``.

An archive is opened once per process (keyed by its path, size and modification time); its extraction
directory lives until the process exits, as the tokenizer is read from it after loading.
"""

from __future__ import annotations

import atexit
import pickle
import posixpath
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import torch

from oasr.errors import CheckpointFormatError

NEMO_SUFFIX = ".nemo"
CONFIG_NAME = "model_config.yaml"
WEIGHTS_NAME = "model_weights.ckpt"
#: limits on what an archive may hold (a Parakeet 1.1B archive is ~4.3 GB of weights, a few MB else)
MAX_MEMBERS = 4096
MAX_SMALL_BYTES = 256 * 2 ** 20
MAX_WEIGHTS_BYTES = 64 * 2 ** 30
#: the config's prefix of a file name stored inside the archive
ARCHIVE_PREFIX = "nemo:"

_OPENED: dict[tuple[str, int, int], NemoArchive] = {}


def _normalized(name: str) -> str | None:
    """The member name relative to the archive root, or None if it leads outside it."""
    if name.startswith("/") or "\\" in name:
        return None
    norm = posixpath.normpath(name)
    if norm == ".." or norm.startswith("../"):
        return None
    return "" if norm == "." else norm


def _check_member(path: Path, member: tarfile.TarInfo) -> str:
    name = _normalized(member.name)
    if name is None:
        raise CheckpointFormatError(f"{path}: archive member {member.name!r} leads outside the archive; refusing "
                                    f"to read this .nemo file", path=path)
    if member.issym() or member.islnk():
        target = member.linkname if member.islnk() else posixpath.join(posixpath.dirname(name), member.linkname)
        if member.linkname.startswith("/") or _normalized(target) is None:
            raise CheckpointFormatError(f"{path}: archive member {member.name!r} links to {member.linkname!r}, "
                                        f"outside the archive; refusing to read this .nemo file", path=path)
    elif not (member.isfile() or member.isdir()):
        raise CheckpointFormatError(f"{path}: archive member {member.name!r} is a device or FIFO, not a file; "
                                    f"refusing to read this .nemo file", path=path)
    return name


class NemoArchive:
    """One ``.nemo`` file: its members by name, the parsed config, the weights and extracted small files."""

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            tar = tarfile.open(self.path, "r:*")
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise CheckpointFormatError(f"{self.path} is not a readable .nemo archive (a tar file): {exc}",
                                        path=self.path) from None
        with tar:
            self.members = self._scan(tar)
        self._extracted: Path | None = None
        self._config: dict[str, Any] | None = None

    def _scan(self, tar: tarfile.TarFile) -> dict[str, tarfile.TarInfo]:
        members: dict[str, tarfile.TarInfo] = {}
        try:
            for count, member in enumerate(tar, 1):
                if count > MAX_MEMBERS:
                    raise CheckpointFormatError(f"{self.path}: more than {MAX_MEMBERS} archive members; not a "
                                                f".nemo model archive", path=self.path)
                name = _check_member(self.path, member)
                if member.isfile():
                    members[name] = member
        except (tarfile.TarError, EOFError) as exc:
            raise CheckpointFormatError(f"{self.path}: the .nemo archive is corrupt or truncated: {exc}",
                                        path=self.path) from None
        return members

    def find(self, name: str) -> tarfile.TarInfo | None:
        """The regular-file member called ``name`` (at the root, or the one file of that base name)."""
        name = name[len(ARCHIVE_PREFIX):] if name.startswith(ARCHIVE_PREFIX) else name
        name = _normalized(name) or name
        if name in self.members:
            return self.members[name]
        hits = [m for n, m in self.members.items() if posixpath.basename(n) == posixpath.basename(name)]
        return hits[0] if len(hits) == 1 else None

    def require(self, name: str, what: str) -> tarfile.TarInfo:
        member = self.find(name)
        if member is None:
            raise CheckpointFormatError(f"{self.path}: the .nemo archive has no {name!r} ({what}); members: "
                                        f"{', '.join(sorted(self.members)[:12]) or '(none)'}", path=self.path)
        return member

    def extract(self, name: str, what: str) -> Path:
        """A small member copied into this archive's extraction directory; its path there."""
        member = self.require(name, what)
        if member.size > MAX_SMALL_BYTES:
            raise CheckpointFormatError(f"{self.path}: archive member {member.name!r} ({what}) is {member.size} "
                                        f"bytes, over the {MAX_SMALL_BYTES} byte limit", path=self.path)
        root = self._root()
        target = root / posixpath.basename(_normalized(member.name) or "member")
        if not target.is_file():
            data_filter = getattr(tarfile, "data_filter", None)
            if data_filter is not None:
                try:
                    data_filter(member, str(root))
                except tarfile.FilterError as exc:
                    raise CheckpointFormatError(f"{self.path}: archive member {member.name!r}: {exc}",
                                                path=self.path) from None
            with tarfile.open(self.path, "r:*") as tar:
                source = tar.extractfile(member)
                if source is None:
                    raise CheckpointFormatError(f"{self.path}: archive member {member.name!r} is not a regular file",
                                                path=self.path)
                with source, open(target, "wb") as out:
                    shutil.copyfileobj(source, out)
        return target

    def _root(self) -> Path:
        if self._extracted is None:
            self._extracted = Path(tempfile.mkdtemp(prefix="oasr-nemo-"))
            atexit.register(shutil.rmtree, self._extracted, True)
        return self._extracted

    @property
    def config(self) -> dict[str, Any]:
        """``model_config.yaml`` as plain containers, its ``${...}`` interpolations resolved (OmegaConf)."""
        if self._config is None:
            self._config = _read_config(self.path, self.extract(CONFIG_NAME, "the model config"))
        return self._config

    def state_dict(self) -> dict[str, torch.Tensor]:
        """``model_weights.ckpt``'s tensors, unpickled as data only (``weights_only=True``)."""
        member = self.require(WEIGHTS_NAME, "the weights")
        if member.size > MAX_WEIGHTS_BYTES:
            raise CheckpointFormatError(f"{self.path}: {member.name!r} is {member.size} bytes, over the "
                                        f"{MAX_WEIGHTS_BYTES} byte limit", path=self.path)
        with tarfile.open(self.path, "r:*") as tar:
            source = tar.extractfile(member)
            if source is None:
                raise CheckpointFormatError(f"{self.path}: {member.name!r} is not a regular file", path=self.path)
            with source:
                try:
                    obj = torch.load(source, map_location="cpu", weights_only=True)
                except (pickle.UnpicklingError, RuntimeError, AttributeError, TypeError, EOFError,
                        ValueError) as exc:
                    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                    raise CheckpointFormatError(f"{self.path}: {member.name!r} is not a plain tensor state dict "
                                                f"(refused or corrupt: {first})", path=self.path) from exc
        if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
            obj = obj["state_dict"]
        if not isinstance(obj, dict):
            raise CheckpointFormatError(f"{self.path}: {member.name!r} holds a {type(obj).__name__}, not a state "
                                        f"dict", path=self.path)
        return {k: v for k, v in obj.items() if isinstance(k, str) and isinstance(v, torch.Tensor)}


def _read_config(path: Path, file: Path) -> dict[str, Any]:
    import yaml
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        raw = yaml.safe_load(file.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise CheckpointFormatError(f"{path}: {CONFIG_NAME} is not valid YAML: {exc}", path=path) from None
    if not isinstance(raw, dict):
        raise CheckpointFormatError(f"{path}: {CONFIG_NAME} is not a mapping", path=path)
    try:
        return OmegaConf.to_container(OmegaConf.create(raw), resolve=True)
    except OmegaConfBaseException as exc:
        raise CheckpointFormatError(f"{path}: {CONFIG_NAME} has an interpolation that does not resolve: {exc}",
                                    path=path) from None


def open_archive(path: str | Path) -> NemoArchive:
    """The archive at ``path``, opened once per process for each version of the file."""
    path = Path(path).resolve()
    try:
        stat = path.stat()
    except OSError as exc:
        raise CheckpointFormatError(f"cannot read {path}: {exc}", path=path) from None
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _OPENED:
        _OPENED[key] = NemoArchive(path)
    return _OPENED[key]


def is_nemo_archive(path: str | Path) -> bool:
    """True for a ``.nemo`` file that is a tar archive holding a ``model_config.yaml``."""
    path = Path(path)
    if path.suffix != NEMO_SUFFIX or not path.is_file():
        return False
    try:
        return open_archive(path).find(CONFIG_NAME) is not None
    except CheckpointFormatError:
        return False


__all__ = ["NEMO_SUFFIX", "NemoArchive", "is_nemo_archive", "open_archive"]
