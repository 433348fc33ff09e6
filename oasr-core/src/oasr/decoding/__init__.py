"""Search algorithms and result types shared by the decode strategies."""

from oasr.decoding.types import Hypothesis, Segment, WordTiming

__all__ = ["Hypothesis", "Segment", "WordTiming"]
