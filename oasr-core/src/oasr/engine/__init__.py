"""The engine: offline batching and (later) streaming over any registered architecture."""

from oasr.decoding.types import Segment, WordTiming
from oasr.engine.options import DecodingOptions, RequestOutput

__all__ = ["DecodingOptions", "RequestOutput", "Segment", "WordTiming"]
