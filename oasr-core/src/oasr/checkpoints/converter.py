"""The checkpoint converter contract: how a source framework's directory becomes an OASR model.

A converter states only positive markers of its own format in :meth:`CheckpointConverter.detect`
and how specific they are (:attr:`detect_specificity`); the registry ranks the claims.  Never add a
negative guard naming another framework's files.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any, ClassVar

import attrs
import torch

from oasr.errors import CheckpointFormatError
from oasr.models.base import BaseModelConfig
from oasr.models.specs import DecodingDefaults, FeatureSpec, TokenizerSpec

#: a named config file whose field names the architecture (config.json: model_type == "whisper")
DETECT_KEYED_VALUE = 30
#: a framework-specific config file exists (WeNet's train.yaml): names the framework only
DETECT_NAMED_CONFIG = 20
#: file name / asset conventions only (epoch-*.pt, tokens.txt beside the weights)
DETECT_ASSET_LAYOUT = 10


@attrs.define
class ConvertedCheckpoint:
    """Everything needed to build and run a model, from one source directory."""

    architecture: str
    model_config: BaseModelConfig
    state_dict: dict[str, torch.Tensor]
    tokenizer: TokenizerSpec
    features: FeatureSpec
    decoding: DecodingDefaults
    source: Path | None = None


class CheckpointConverter:
    """Base class of a source-format converter; subclass and register with the model."""

    #: the model registry key this converter produces
    architecture: ClassVar[str] = ""
    detect_specificity: ClassVar[int] = DETECT_ASSET_LAYOUT
    #: checkpoint key prefixes that are fine to leave unused (training-only heads): silent
    expected_unused_prefixes: ClassVar[tuple[str, ...]] = ()
    #: checkpoint key prefix → what capability is lost if those keys are dropped: a named warning
    capability_drop_hints: ClassVar[dict[str, str]] = {}
    #: name suffixes of single-file sources (an archive) this converter reads: loading accepts such a file
    #: where it otherwise wants a directory, and asks only the converters that list its suffix to detect it
    source_file_suffixes: ClassVar[tuple[str, ...]] = ()

    def detect(self, path: Path) -> bool:
        """True if ``path`` (a directory, or a file of :attr:`source_file_suffixes`) carries this converter's
        own format markers."""
        raise NotImplementedError

    def load_state_dict(self, path: Path) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def build_config(self, path: Path, state_dict: dict[str, torch.Tensor]) -> BaseModelConfig:
        raise NotImplementedError

    def tokenizer_spec(self, path: Path, config: BaseModelConfig) -> TokenizerSpec:
        raise NotImplementedError

    def feature_spec(self, path: Path, config: BaseModelConfig) -> FeatureSpec:
        raise NotImplementedError

    def decoding_defaults(self, path: Path, config: BaseModelConfig) -> DecodingDefaults:
        raise NotImplementedError

    def convert(self, path: str | Path) -> ConvertedCheckpoint:
        path = Path(path)
        state_dict = self.load_state_dict(path)
        config = self.build_config(path, state_dict)
        return ConvertedCheckpoint(
            architecture=self.architecture,
            model_config=config,
            state_dict=state_dict,
            tokenizer=self.tokenizer_spec(path, config),
            features=self.feature_spec(path, config),
            decoding=self.decoding_defaults(path, config),
            source=path,
        )


def load_torch_checkpoint(path: str | Path) -> Any:
    """Load a ``.pt``/``.ckpt`` file as data only (``weights_only=True``).

    A file that needs arbitrary unpickling (pickled classes, code) is refused: checkpoints are data.
    """
    path = Path(path)
    _check_torch_container(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=False)
    except FileNotFoundError:
        raise CheckpointFormatError(f"checkpoint file {path} does not exist", path=path) from None
    except (pickle.UnpicklingError, RuntimeError, AttributeError, TypeError, EOFError, ValueError) as exc:
        text = str(exc)
        if "Unsupported global" in text or "Unsupported class" in text:
            raise CheckpointFormatError(
                f"refusing to load {path}: it is not plain tensors and containers (it needs arbitrary "
                f"unpickling, which can run code). Re-save it as a plain state dict or safetensors. "
                f"Detail: {text.splitlines()[0] if text else type(exc).__name__}",
                path=path,
            ) from exc
        detail = next((line for line in text.splitlines() if "error" in line.lower()), text.splitlines()[0] if text
                      else type(exc).__name__)
        raise CheckpointFormatError(f"cannot read checkpoint {path}: it is corrupt or truncated ({detail.strip()})",
                                    path=path) from exc


def _check_torch_container(path: Path) -> None:
    """Refuse a file that is neither torch.save's zip archive nor a (legacy) pickle, before unpickling."""
    import zipfile

    try:
        with open(path, "rb") as f:
            head = f.read(2)
    except FileNotFoundError:
        raise CheckpointFormatError(f"checkpoint file {path} does not exist", path=path) from None
    except OSError as exc:
        raise CheckpointFormatError(f"cannot read checkpoint {path}: {exc}", path=path) from None
    if not (zipfile.is_zipfile(path) or (len(head) == 2 and head[0] == 0x80 and 2 <= head[1] <= 5)):
        raise CheckpointFormatError(f"{path} is not a PyTorch checkpoint: it is neither a zip archive (what "
                                    f"torch.save writes) nor a pickle; the file is corrupt or of another format",
                                    path=path)


def extract_state_dict(obj: Any, path: Path, keys: tuple[str, ...] = ("model", "state_dict")) -> dict[str, torch.Tensor]:
    """A flat name → tensor dict from a loaded checkpoint (plain, or wrapped under ``model``)."""
    for key in keys:
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
            break
    if not isinstance(obj, dict) or not all(isinstance(k, str) for k in obj):
        raise CheckpointFormatError(f"{path} does not hold a state dict (found {type(obj).__name__})", path=path)
    return {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
