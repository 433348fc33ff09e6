"""What the engine may assume about a model: the engine-facing base classes.

A model is a :class:`BaseAsrModel` with an :class:`BaseEncoder` at ``model.encoder``.  The engine
touches it only through the members documented here and the members its decode strategy declares
it reads (``DecodeStrategy.requires``, checked by :mod:`oasr.models.interfaces`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar

import attrs
import torch
from torch import nn

from oasr.errors import CapabilityError, CheckpointFormatError
from oasr.models.specs import CacheSpec, LoadReport, QuantLayout, StreamStateSpec


@attrs.define(kw_only=True)
class BaseModelConfig:
    """Base of every model config (shape and topology only; no paths, no runtime knobs)."""

    @classmethod
    def tiny(cls) -> BaseModelConfig:
        """A tiny instance of this architecture for contract tests (every architecture must have one)."""
        raise NotImplementedError(f"{cls.__name__} declares no tiny() config")


@attrs.define
class NoModelOptions:
    """A model with no inference-time options."""


@attrs.frozen
class StreamingGeometry:
    """How a streaming encoder consumes features: a window of ``window_frames`` feature frames
    advanced by ``stride_frames`` yields ``chunk_size`` encoder frames."""

    chunk_size: int
    window_frames: int
    stride_frames: int


class BaseEncoder(nn.Module):
    """An acoustic encoder: features (B, T, F) → hidden states (B, T', D).

    ``streaming_kind`` must describe what this config's weights can do, not what the class
    implements: ``"none"`` makes streaming service refuse at construction.
    """

    #: the streaming backend this encoder is driven by (``paged``, ``slot``, ``stateful``; see
    #: :mod:`oasr.models.streaming` for the members each kind implements) or ``"none"``
    streaming_kind: str = "none"
    #: a ``slot`` encoder's per-stream tensors, one :class:`StreamStateSpec` each
    streaming_state_specs: tuple[StreamStateSpec, ...] = ()
    #: the streaming chunk step can be recorded in a CUDA graph: no host synchronisation and no shape
    #: that depends on tensor values (see oasr.engine.graphs)
    supports_step_graphs: bool = False
    #: the streaming chunk (in this encoder's ``streaming_geometry`` unit) used when
    #: ``EngineConfig.chunk_size`` is None: the geometry the architecture's releases stream at
    default_chunk_size: int = 16
    #: feature frames per encoder frame
    subsampling_rate: int = 1
    #: feature frames of look-ahead the subsampling front-end needs beyond a chunk
    right_context: int = 0
    #: feature frames of :attr:`streaming_pad_value` the streaming executor appends after a stream's
    #: last feature frame, so its final windows see what the reference recipe feeds (icefall: 30 tail
    #: frames plus its 13 window-padding frames); 0: nothing appended
    streaming_tail_frames: int = 0
    #: the feature value of those appended frames (icefall: LOG_EPS = log(1e-10))
    streaming_pad_value: float = 0.0

    @property
    def output_size(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} must define output_size")

    @property
    def n_kv_head(self) -> int:
        raise NotImplementedError(
            f"{type(self).__name__} has no paged K/V: n_kv_head is only defined for streaming_kind='paged'"
        )

    @property
    def head_dim(self) -> int:
        raise NotImplementedError(
            f"{type(self).__name__} has no paged K/V: head_dim is only defined for streaming_kind='paged'"
        )

    def stream_request_state(self, options: Any) -> dict[str, torch.Tensor | float]:
        """Values of the persistent :attr:`streaming_state_specs` for a request with ``options``
        (its :class:`DecodingOptions`), written when the stream is admitted; default: none."""
        return {}

    def prepare_streaming(self, chunk_size: int, num_left_chunks: int) -> None:
        """Called once when a streaming engine is built, before :meth:`streaming_geometry` and the
        backend read this encoder: an encoder whose per-stream state extents depend on the engine's
        ``chunk_size`` / ``num_left_chunks`` sizes them here (and raises to refuse them); default: nothing."""

    def streaming_geometry(self, chunk_size: int) -> StreamingGeometry:
        """The feature window for ``chunk_size`` encoder frames; raise to refuse a chunk size."""
        if chunk_size <= 0:
            raise CapabilityError(f"{type(self).__name__}: chunk_size must be positive, got {chunk_size}")
        sub = self.subsampling_rate
        return StreamingGeometry(chunk_size, (chunk_size - 1) * sub + self.right_context + 1, chunk_size * sub)


class BaseAsrModel(nn.Module):
    """A complete recognizer: encoder plus the heads/decoders its decode families need."""

    #: the attrs class of this model's config
    config_class: ClassVar[type[BaseModelConfig]] = BaseModelConfig
    #: buffers computed at construction (positional tables): never required from a checkpoint and
    #: never written to a native bundle
    computed_buffer_suffixes: ClassVar[tuple[str, ...]] = ()
    #: declarative checkpoint-key renames applied by :meth:`load_weights`: (regex, replacement)
    weight_renames: ClassVar[tuple[tuple[str, str], ...]] = ()
    #: per-request options the encoder honours (for example ``"language"`` for a prompted encoder)
    encoder_options: ClassVar[frozenset[str]] = frozenset()
    #: attrs class of inference-time model options (``EngineConfig.model_options``)
    options_class: ClassVar[type] = NoModelOptions
    #: the longest audio (seconds) this model decodes comfortably in one forward (memory, attention
    #: cost); the engine cuts longer audio at VAD silences into segments of at most this (None: no
    #: limit of its own; ``EngineConfig.long_form_seconds`` overrides it)
    max_segment_seconds: ClassVar[float | None] = None

    encoder: BaseEncoder

    def __init__(self, config: BaseModelConfig):
        super().__init__()
        self.config = config
        self.options = self.options_class()

    def configure(self, options: Any) -> None:
        """Apply inference-time options (an instance of :attr:`options_class`)."""
        self.options = options

    @classmethod
    def from_config(cls, config: BaseModelConfig) -> BaseAsrModel:
        return cls(config)

    # -- decode methods -------------------------------------------------------------------------
    @property
    def capabilities(self) -> frozenset[str]:
        """The decode methods (registered strategy names) this checkpoint can be decoded with; the
        one used unless the caller names another is the checkpoint's ``DecodingDefaults.decode_type``."""
        return frozenset()

    # -- forward surfaces ---------------------------------------------------------------------------
    def encode_offline(self, feats: torch.Tensor, feat_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Encoder only: (B, T, F), (B,) → hidden (B, T', D), lengths (B,)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement encode_offline")

    def forward_offline(self, feats: torch.Tensor, feat_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Encoder + CTC head: (B, T, F), (B,) → log-probs (B, T', V), lengths (B,)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement forward_offline")

    # -- streaming ------------------------------------------------------------------------------------
    @property
    def cache_spec(self) -> CacheSpec | None:
        """The streaming cache, or None when the encoder cannot stream."""
        return None

    # -- quantization and dtype -----------------------------------------------------------------------
    def quantization_layout(self) -> QuantLayout:
        return QuantLayout()

    @property
    def compute_dtype(self) -> torch.dtype:
        """The floating dtype activations run in (int8 weight storage does not change it)."""
        for p in self.parameters():
            if p.is_floating_point():
                return p.dtype
        for b in self.buffers():
            if b.is_floating_point():
                return b.dtype
        return torch.float32

    @property
    def device(self) -> torch.device:
        for t in self.parameters():
            return t.device
        return torch.device("cpu")

    # -- weights --------------------------------------------------------------------------------------
    def is_computed_buffer(self, key: str) -> bool:
        return any(key.endswith(suffix) for suffix in self.computed_buffer_suffixes)

    def remap_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Source-format keys → this model's keys.  Default: apply :attr:`weight_renames` in order."""
        out: dict[str, torch.Tensor] = {}
        compiled = [(re.compile(pattern), repl) for pattern, repl in self.weight_renames]
        for key, value in state_dict.items():
            for pattern, repl in compiled:
                key = pattern.sub(repl, key)
            out[key] = value
        return out

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> LoadReport:
        """Copy a source-format state dict into this model and report what happened.

        Keys are renamed by :meth:`remap_state_dict`; a shape mismatch is an error naming the key;
        checkpoint keys nothing uses are ``dropped`` and model tensors nothing filled are ``missing``
        (the registry decides which of those are fatal).
        """
        remapped = self.remap_state_dict(state_dict)
        own = self.state_dict()
        mapped: list[str] = []
        unexpected: list[str] = []
        with torch.no_grad():
            for key, value in remapped.items():
                target = own.get(key)
                if target is None or self.is_computed_buffer(key):
                    unexpected.append(key)
                    continue
                if not isinstance(value, torch.Tensor):
                    raise CheckpointFormatError(f"checkpoint entry {key!r} is a {type(value).__name__}, expected a tensor")
                if tuple(target.shape) != tuple(value.shape):
                    raise CheckpointFormatError(
                        f"checkpoint tensor {key!r} has shape {tuple(value.shape)}, the model expects "
                        f"{tuple(target.shape)}; the config does not match these weights"
                    )
                target.copy_(value.to(dtype=target.dtype))
                mapped.append(key)
        filled = set(mapped)
        missing = [k for k in own if k not in filled and not self.is_computed_buffer(k)]
        return LoadReport.build(mapped=mapped, unexpected=unexpected, missing=missing)

    def native_state_dict(self) -> dict[str, torch.Tensor]:
        """The state dict a native bundle stores: everything but the computed buffers."""
        return {k: v for k, v in self.state_dict().items() if not self.is_computed_buffer(k)}


def resolve_member(obj: Any, dotted: str) -> Any:
    """Follow a dotted attribute path (``"decoder.prefill"``); raise AttributeError if absent."""
    for part in dotted.split("."):
        obj = getattr(obj, part)
        if obj is None:
            raise AttributeError(dotted)
    return obj
