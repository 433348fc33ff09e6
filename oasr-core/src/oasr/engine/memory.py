"""Admission by memory: refuse a forward whose full-attention scores cannot fit.

A full-attention encoder over ``T`` encoder frames materializes score-sized tensors of ``B × H × T²``
elements in every attention layer (the scores, their softmax, an additive bias or mask).  Under
inference the layers run one after another and each frees its scores before the next starts, so the
peak is set by the widest layer (the most heads), not by the number of layers; the estimate is

    ``ATTENTION_COPIES × B × H × T² × itemsize(compute dtype)``

with ``T = seconds × encoder frames per second`` (capped at a fixed input window).  The constant is an
upper bound fitted to measured peaks (``tests/serve/test_memory.py`` checks it against a measured forward
at two lengths: WeNet's relative-position attention peaks at ≈2.4 copies).

The attention layers are found as the waist's :class:`oasr.layers.attention.Attention` modules inside
``model.encoder``; an encoder without them gets no estimate (nothing is refused).  The limit is
``OASR_MAX_FORWARD_BYTES`` (bytes) or, by default, half of the device's memory (the machine's RAM on CPU).
"""

from __future__ import annotations

import os
from typing import Any

import attrs
import torch

from oasr.errors import ConfigError, RequestError

#: score-sized tensors alive at once in one attention layer (an upper bound; see the module docstring)
ATTENTION_COPIES = 3.0
#: share of the device's memory one forward may take unless OASR_MAX_FORWARD_BYTES says otherwise
DEFAULT_MEMORY_SHARE = 0.5


def device_memory_bytes(device: str | torch.device) -> int:
    """Total memory of ``device``: the GPU's, or the machine's RAM for the CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def forward_limit_bytes(device: str | torch.device) -> tuple[int, str]:
    """(the most bytes one forward may take, where that number comes from)."""
    env = os.environ.get("OASR_MAX_FORWARD_BYTES")
    if env:
        try:
            limit = int(float(env))
        except ValueError:
            limit = 0
        if limit <= 0:
            raise ConfigError(f"OASR_MAX_FORWARD_BYTES must be a positive number of bytes, got {env!r}",
                              key="OASR_MAX_FORWARD_BYTES")
        return limit, "OASR_MAX_FORWARD_BYTES"
    total = device_memory_bytes(device)
    return int(total * DEFAULT_MEMORY_SHARE), f"half of the {torch.device(device).type} memory; set OASR_MAX_FORWARD_BYTES"


@attrs.define(frozen=True)
class ForwardMemory:
    """The attention footprint of one engine's model (``heads == 0``: no full-attention estimate)."""

    heads: int
    itemsize: int
    #: encoder frames per second of audio
    frames_per_second: float
    #: encoder frames per scheduler cost unit (feature frame)
    frames_per_cost: float
    #: a fixed input window caps the frames of one forward (None: the whole audio at once)
    window_frames: int | None
    limit: int
    limit_source: str

    @classmethod
    def for_engine(cls, engine: Any) -> ForwardMemory:
        from oasr.layers.attention import Attention

        model, features = engine.model, engine.feature_config
        heads = max((m.n_heads for m in model.encoder.modules() if isinstance(m, Attention)), default=0)
        per_frame = max(1, int(getattr(features, "lfr_n", 1) or 1)) * max(1, int(model.encoder.subsampling_rate))
        fps = 1000.0 / float(features.frame_shift_ms) / per_frame
        window = engine.window_seconds
        limit, source = forward_limit_bytes(engine.config.device)
        return cls(heads, torch.empty((), dtype=model.compute_dtype).element_size(), fps, 1.0 / per_frame,
                   None if window is None else int(round(window * fps)), limit, source)

    def frames(self, seconds: float) -> int:
        frames = int(seconds * self.frames_per_second) + 1
        return frames if self.window_frames is None else min(frames, self.window_frames)

    def estimate(self, frames: int, batch: int = 1) -> int:
        """Peak bytes of the attention scores for ``batch`` rows of ``frames`` encoder frames."""
        return int(ATTENTION_COPIES * batch * self.heads * frames * frames * self.itemsize)

    def max_seconds(self) -> float:
        """The longest audio whose forward fits the limit."""
        frames = (self.limit / (ATTENTION_COPIES * self.heads * self.itemsize)) ** 0.5
        return max(0.0, (frames - 1) / self.frames_per_second)

    def check(self, seconds: float, request_id: str) -> None:
        """Refuse ``seconds`` of audio whose forward cannot fit (RequestError naming the limit and the way out)."""
        if not self.heads:
            return
        frames = self.frames(seconds)
        need = self.estimate(frames)
        if need <= self.limit:
            return
        raise RequestError(
            f"request {request_id}: audio is {seconds:.0f} s; this model attends over the whole input at once "
            f"and a forward over {frames} encoder frames needs about {need / 2**30:.1f} GiB ({self.heads} heads x "
            f"{frames}^2 scores x {self.itemsize} bytes x {ATTENTION_COPIES:g}), over the forward memory limit of "
            f"{self.limit / 2**30:.1f} GiB ({self.limit_source}). Split the audio into pieces of at most "
            f"{self.max_seconds():.0f} s (or segment it with VAD), or raise the limit",
            request_id=request_id, param="file")

    def fits_batch(self, batch: int, longest_cost: int) -> bool:
        """Whether ``batch`` rows padded to ``longest_cost`` feature frames fit the limit (scheduler hook)."""
        if not self.heads or batch <= 1:
            return True
        frames = int(longest_cost * self.frames_per_cost) + 1
        if self.window_frames is not None:
            frames = min(frames, self.window_frames)
        return self.estimate(frames, batch) <= self.limit
