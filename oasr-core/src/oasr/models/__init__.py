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
from oasr.models.interfaces import CAPABILITIES, Capability, require_capability
from oasr.models.loading import LoadedModel, from_pretrained, load_pretrained
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
    "CAPABILITIES", "DETECT_ASSET_LAYOUT", "DETECT_KEYED_VALUE", "DETECT_NAMED_CONFIG", "BaseAsrModel",
    "BaseEncoder", "BaseModelConfig", "CacheSpec", "Capability", "CheckpointConverter", "ConvertedCheckpoint",
    "DecodingDefaults", "FeatureSpec", "LoadReport", "LoadedModel", "QuantLayout", "SmoothGroup",
    "StreamStateSpec", "StreamingGeometry", "TokenizerSpec", "extract_state_dict", "from_pretrained",
    "list_models", "load_pretrained", "load_torch_checkpoint", "model_infos", "register_model",
    "require_capability", "unregister_model",
]
