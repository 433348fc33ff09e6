"""The streaming encoder contracts: one Protocol per backend kind, and what a paged chunk returns.

``encoder.streaming_kind`` names the kind; the engine's backend of that kind owns the per-stream
state (see :mod:`oasr.engine.backends`) and drives the encoder through exactly these members:

``paged`` (:class:`PagedStreamingEncoder`)
    attention K/V in a block pool the engine owns, plus an optional convolution tail per layer,
    described by ``model.cache_spec`` (uniform attention layers).
``slot`` (:class:`SlotStreamingEncoder`)
    every per-stream tensor declared as a :class:`StreamStateSpec`, each with its own shape, so a
    stack whose layers differ (widths, downsampling) declares one spec per layer tensor.
``stateful`` (:class:`StatefulStreamingEncoder`)
    the encoder keeps its own state object per stream (streams run one at a time: the parity oracle).

All three receive each stream's feature window (``streaming_geometry(chunk_size).window_frames``
frames, shorter rows padded, ``feat_lens`` their valid frames) and return the chunk's hidden states
``(B, C, D)`` with each row's valid frame count; the decode strategy's stream search applies its
own head to them.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import attrs
import torch

from oasr.models.specs import StreamStateSpec

KV = tuple[torch.Tensor, torch.Tensor]


@attrs.define
class ChunkOutput:
    """What one paged ``forward_chunk`` call produces.

    ``hidden`` (B, C, D) and ``lengths`` (B,) valid frames per row; ``kv`` per layer the (k, v) of
    these C frames, (B, H, C, d_k) each (frames past a row's length are padding); ``conv_cache``
    (layers, B, conv_cache_frames, conv_channels), or None when the encoder has no convolution tail.
    """

    hidden: torch.Tensor
    lengths: torch.Tensor
    kv: list[KV]
    conv_cache: torch.Tensor | None


@runtime_checkable
class PagedStreamingEncoder(Protocol):
    """``streaming_kind == "paged"``: K/V pages are gathered per cohort, and written back by the engine."""

    def forward_chunk(self, feats: torch.Tensor, offsets: torch.Tensor, kv_cache: list[KV] | None,
                      conv_cache: torch.Tensor | None, *, cache_lens: torch.Tensor | None,
                      feat_lens: torch.Tensor | None) -> ChunkOutput:
        """``offsets`` (B,) encoder frames each stream has produced; ``kv_cache`` per layer (k, v),
        (B, H, T_cache, d) left-aligned with ``cache_lens`` valid frames per row (None: no history);
        ``conv_cache`` (layers, B, frames, channels) or None."""


@runtime_checkable
class SlotStreamingEncoder(Protocol):
    """``streaming_kind == "slot"``: every per-stream tensor is a declared :class:`StreamStateSpec`."""

    streaming_state_specs: tuple[StreamStateSpec, ...]

    def forward_chunk_slots(self, feats: torch.Tensor, feat_lens: torch.Tensor, offsets: torch.Tensor,
                            states: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor,
                                                                      dict[str, torch.Tensor]]:
        """``states`` maps each spec's name to the cohort's rows of it (slot axis = cohort); returns
        (hidden, lengths, the updated states of the names it changed)."""

    def stream_request_state(self, options: Any) -> dict[str, torch.Tensor | float]:
        """Values of the persistent states for a request with ``options``, written at admission
        (a state not named here starts at its ``fill_value``)."""


@runtime_checkable
class StatefulStreamingEncoder(Protocol):
    """``streaming_kind == "stateful"``: the encoder owns one state object per stream."""

    def init_stream_state(self, batch_size: int, device: torch.device | str) -> Any:
        """A fresh state for ``batch_size`` streams (the engine asks for one per stream)."""

    def forward_chunk_stateful(self, feats: torch.Tensor, state: Any, *, feat_lens: torch.Tensor | None,
                               required_cache_size: int) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """One chunk of one stream: (hidden, lengths, the new state).  ``required_cache_size`` is the
        attention history to keep in frames (< 0: all)."""


#: the Protocol an encoder of each streaming kind implements
STREAMING_PROTOCOLS: dict[str, type] = {
    "paged": PagedStreamingEncoder,
    "slot": SlotStreamingEncoder,
    "stateful": StatefulStreamingEncoder,
}
