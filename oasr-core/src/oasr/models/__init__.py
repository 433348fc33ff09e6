"""Model contracts (base classes, decode-strategy requirements, streaming Protocols) and the registry."""

from oasr.models.base import BaseAsrModel, BaseEncoder, BaseModelConfig, StreamingGeometry
from oasr.models.interfaces import Requirement, check_requirements, missing_members
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
    "BaseAsrModel", "BaseEncoder", "BaseModelConfig", "CacheSpec", "DecodingDefaults", "FeatureSpec", "LoadReport",
    "QuantLayout", "Requirement", "SmoothGroup", "StreamStateSpec", "StreamingGeometry", "TokenizerSpec",
    "check_requirements", "list_models", "missing_members", "model_infos", "register_model", "unregister_model",
]
