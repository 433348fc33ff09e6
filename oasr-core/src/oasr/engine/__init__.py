"""The engine: offline batching and streaming over any registered architecture."""

from oasr.decoding.types import Segment, WordTiming
from oasr.engine.config import EngineConfig
from oasr.engine.engine import ASREngine, Engine
from oasr.engine.options import DecodingOptions, RequestOutput

__all__ = ["ASREngine", "DecodingOptions", "Engine", "EngineConfig", "RequestOutput", "Segment", "WordTiming"]
