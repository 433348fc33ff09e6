"""Model contracts, the registry and checkpoint loading."""

from oasr.models.base import BaseAsrModel, BaseEncoder, BaseModelConfig, StreamingGeometry
from oasr.models.converter import (
    DETECT_ASSET_LAYOUT,
    DETECT_KEYED_VALUE,
    DETECT_NAMED_CONFIG,
    CheckpointConverter,
    ConvertedCheckpoint,
    extract_state_dict,
    load_torch_checkpoint,
)
from oasr.models.interfaces import Requirement, check_requirements, missing_members
from oasr.models.loaded import LoadedModel
from oasr.models.loading import from_pretrained, load_pretrained
from oasr.models.registry import list_models, model_infos, register_model, unregister_model
from oasr.models.specs import (
    CacheSpec,
    DecodingDefaults,
    FeatureSpec,
    LoadReport,
    QuantLayout,
    SmoothGroup,
    StreamStateSpec,
    TokenizerSpec,
)

__all__ = [
    "DETECT_ASSET_LAYOUT", "DETECT_KEYED_VALUE", "DETECT_NAMED_CONFIG", "BaseAsrModel",
    "BaseEncoder", "BaseModelConfig", "CacheSpec", "CheckpointConverter", "ConvertedCheckpoint",
    "DecodingDefaults", "FeatureSpec", "LoadReport", "LoadedModel", "QuantLayout", "SmoothGroup",
    "Requirement", "StreamStateSpec", "StreamingGeometry", "TokenizerSpec", "check_requirements",
    "extract_state_dict", "from_pretrained", "list_models", "load_pretrained", "load_torch_checkpoint",
    "missing_members", "model_infos", "register_model", "unregister_model",
]
