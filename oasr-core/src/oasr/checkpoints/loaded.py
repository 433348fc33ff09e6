"""A loaded model with the specs that travel with its checkpoint, and how it is put on a device."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import torch

from oasr.models.base import BaseAsrModel, BaseModelConfig
from oasr.models.specs import DecodingDefaults, FeatureSpec, LoadReport, TokenizerSpec

NATIVE_CONFIG = "oasr_config.json"


@attrs.define
class LoadedModel:
    """A model with everything that travels with its checkpoint."""

    model: BaseAsrModel
    architecture: str
    config: BaseModelConfig
    tokenizer_spec: TokenizerSpec
    feature_spec: FeatureSpec
    decoding_defaults: DecodingDefaults
    load_report: LoadReport
    source: Path
    #: directory the tokenizer spec's relative file names are resolved against
    tokenizer_root: Path
    quantization: dict[str, Any] | None = None


def parse_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    names = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
             "half": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float64": torch.float64}
    try:
        return names[str(dtype).lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(names)}") from None


def finish_model(model: BaseAsrModel, *, device: str | torch.device = "cpu",
                 dtype: str | torch.dtype | None = None) -> BaseAsrModel:
    """eval mode, dtype cast on the host, then the device move (never a second copy on the device)."""
    model.eval()
    dtype = parse_dtype(dtype)
    if dtype is not None:
        model.to(dtype=dtype)
    return model.to(device=torch.device(device))
