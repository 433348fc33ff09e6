"""``from_pretrained`` / ``load_pretrained``: from a directory, alias or hub id to a ready model.

A source is a directory, or a single file that a converter lists among its ``source_file_suffixes``
(an archive it unpacks itself).  Resolution precedence:

1. a native bundle (``oasr_config.json``) loads directly, with no third-party framework;
2. an explicit ``architecture=`` picks that converter, no sniffing;
3. otherwise every converter's ``detect`` claim is ranked by specificity.

Before anything is read, the directory's symbolic links are checked (:func:`oasr.checkpoints.files.check_links`:
links stay inside the model, or in a hub cache snapshot inside its repository's ``blobs/``), and any
error a converter raises that is not already an :class:`~oasr.errors.OasrError` (a library's error on
a corrupt file) becomes a :class:`~oasr.errors.CheckpointFormatError` naming the directory.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import attrs
import torch

from oasr import plugins
from oasr.checkpoints.converter import CheckpointConverter, ConvertedCheckpoint
from oasr.checkpoints.loaded import LoadedModel, finish_model
from oasr.errors import CheckpointFormatError, OasrError, UnknownModelError
from oasr.models.base import BaseAsrModel
from oasr.models.registry import converter_for, detect_architecture, model_class
from oasr.models.specs import LoadReport


def resolve_source(id_or_path: str | os.PathLike) -> Path:
    """A local directory for a path, a registered alias or a Hugging Face Hub id."""
    text = os.fspath(id_or_path)
    path = Path(text).expanduser()
    if path.exists():
        if not path.is_dir() and not _claimed_file(path):
            raise CheckpointFormatError(f"{path} is a file; pass the checkpoint directory that contains it", path=path)
        return path.resolve()
    aliases = plugins.registry("aliases")
    if text in aliases:
        return Path(aliases.get(text).load()()).resolve()
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(text)
    except HFValidationError:
        raise CheckpointFormatError(
            f"{text!r} is neither an existing directory, a registered alias "
            f"({', '.join(aliases.names()) or 'none'}) nor a valid Hugging Face Hub id",
            path=text,
        ) from None
    if "/" not in text:
        raise CheckpointFormatError(
            f"{text!r} is not a local directory or a registered alias "
            f"({', '.join(aliases.names()) or 'none'}); hub ids have the form 'owner/name'",
            path=text,
        )
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id=text)).resolve()
    except Exception as exc:
        offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
        hint = " (HF_HUB_OFFLINE is set and it is not in the local cache)" if offline else ""
        raise CheckpointFormatError(f"cannot fetch hub model {text!r}{hint}: {exc}", path=text) from exc


def _claimed_file(path: Path) -> bool:
    """True when a registered converter reads files named like ``path`` (its ``source_file_suffixes``)."""
    for entry in plugins.registry("models"):
        if entry.meta.get("converter") is None:
            continue
        try:
            converter = entry.load_meta("converter")
        except Exception:  # noqa: BLE001 - detection reports converters that fail to import
            continue
        if path.suffix and path.suffix in converter.source_file_suffixes:
            return True
    return False


def account_for_load(report: LoadReport, converter: CheckpointConverter | None, source: Path,
                     computed: tuple[str, ...] = ()) -> None:
    """Apply the weight-load policy: declared-unused drops are silent, capability drops warn by
    name, other drops warn, and any model tensor left unfilled is an error."""
    unused_prefixes = converter.expected_unused_prefixes if converter else ()
    hints = converter.capability_drop_hints if converter else {}
    fired: dict[str, str] = {}
    unexplained: list[str] = []
    for key in report.dropped:
        if key.startswith(tuple(unused_prefixes)) or (computed and key.endswith(computed)):
            continue  # declared unused, or a computed buffer (positional tables) the model rebuilds
        hit = next((p for p in hints if key.startswith(p)), None)
        if hit is not None:
            fired[hit] = hints[hit]
        else:
            unexplained.append(key)
    for prefix, message in fired.items():
        warnings.warn(f"{source}: checkpoint tensors under {prefix!r} were not loaded: {message}",
                      RuntimeWarning, stacklevel=3)
    if unexplained:
        shown = ", ".join(unexplained[:8]) + (" ..." if len(unexplained) > 8 else "")
        warnings.warn(f"{source}: {len(unexplained)} checkpoint tensor(s) were not used by the model: {shown}",
                      RuntimeWarning, stacklevel=3)
    if report.missing:
        shown = ", ".join(report.missing[:12]) + (" ..." if len(report.missing) > 12 else "")
        hint_text = "".join(f" Hint: {m}" for m in fired.values())
        raise CheckpointFormatError(
            f"{source}: {len(report.missing)} model tensor(s) were not filled by the checkpoint: {shown}. "
            f"The model would run with them at their initial values.{hint_text}",
            path=source,
        )


def materialize(converted: ConvertedCheckpoint, converter: CheckpointConverter | None, *,
                device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None) -> LoadedModel:
    cls = model_class(converted.architecture)
    model = cls.from_config(converted.model_config)
    report = model.load_weights(converted.state_dict)
    source = converted.source or Path(".")
    account_for_load(report, converter, source, cls.computed_buffer_suffixes)
    finish_model(model, device=device, dtype=dtype)
    return LoadedModel(
        model=model,
        architecture=converted.architecture,
        config=converted.model_config,
        tokenizer_spec=converted.tokenizer,
        feature_spec=converted.features,
        decoding_defaults=converted.decoding,
        load_report=report,
        source=source,
        tokenizer_root=source,
    )


def convert_checkpoint(path: Path, architecture: str | None = None) -> tuple[ConvertedCheckpoint, CheckpointConverter]:
    """Run the converter chosen by ``architecture=`` or by detection over a source directory.

    A directory no converter claims, whose marker files show a layout an OASR family distribution reads,
    is refused naming that distribution and how to install or enable it (:mod:`oasr.checkpoints.families`).
    """
    try:
        name = architecture or detect_architecture(path)
    except CheckpointFormatError as exc:
        from oasr.checkpoints.families import install_hint

        hint = install_hint(path)
        if hint is None:
            raise
        raise CheckpointFormatError(hint, path=path) from exc
    converter = converter_for(name)
    try:
        converted = converter.convert(path)
    except OasrError:
        raise
    except Exception as exc:  # a library's error on a corrupt file: name the checkpoint
        raise CheckpointFormatError(f"{path}: the {name!r} converter could not read this checkpoint (corrupt or "
                                    f"incomplete files?): {type(exc).__name__}: {exc}", path=path) from exc
    if converted.architecture != name:
        converted = attrs.evolve(converted, architecture=name)
    return converted, converter


def load_pretrained(id_or_path: str | os.PathLike, *, architecture: str | None = None,
                    device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None) -> LoadedModel:
    """Load a checkpoint with its tokenizer, feature and decoding specs and the load report."""
    from oasr.checkpoints.files import check_links
    from oasr.checkpoints.native import is_native_bundle, load_native

    path = resolve_source(id_or_path)
    check_links(path)
    if is_native_bundle(path):
        loaded = load_native(path, device=device, dtype=dtype)
        if architecture is not None and architecture != loaded.architecture:
            raise UnknownModelError(
                f"{path} is a native bundle of architecture {loaded.architecture!r}, not {architecture!r}",
                name=architecture,
            )
        return loaded
    converted, converter = convert_checkpoint(path, architecture)
    return materialize(converted, converter, device=device, dtype=dtype)


def from_pretrained(id_or_path: str | os.PathLike, *, architecture: str | None = None,
                    device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None) -> BaseAsrModel:
    """Load a model from a directory, alias or hub id; ``model.config`` holds its config."""
    return load_pretrained(id_or_path, architecture=architecture, device=device, dtype=dtype).model
