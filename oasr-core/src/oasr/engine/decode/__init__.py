"""Decode strategies (one per decode family) and their contract."""

from oasr.engine.decode.base import DecodeBatch, DecodeContext, DecodeStrategy, NoOptions

__all__ = ["DecodeBatch", "DecodeContext", "DecodeStrategy", "NoOptions"]
