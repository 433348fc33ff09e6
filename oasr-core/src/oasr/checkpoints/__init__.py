"""Checkpoints: source-format converters, loading (``from_pretrained``), and OASR's native bundle."""

from oasr.checkpoints.converter import (
    DETECT_ASSET_LAYOUT,
    DETECT_KEYED_VALUE,
    DETECT_NAMED_CONFIG,
    CheckpointConverter,
    ConvertedCheckpoint,
    extract_state_dict,
    load_torch_checkpoint,
)
from oasr.checkpoints.loaded import LoadedModel
from oasr.checkpoints.loading import from_pretrained, load_pretrained

__all__ = [
    "DETECT_ASSET_LAYOUT", "DETECT_KEYED_VALUE", "DETECT_NAMED_CONFIG", "CheckpointConverter", "ConvertedCheckpoint",
    "LoadedModel", "extract_state_dict", "from_pretrained", "load_pretrained", "load_torch_checkpoint",
]
