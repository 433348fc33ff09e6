"""The specs a checkpoint carries with it, and the streaming and quantization declarations.

All are frozen attrs classes serialized through :mod:`oasr.serde`; together with the model config
they are the whole of ``oasr_config.json``, so the engine never sniffs paths or applies defaults of
its own that fight the checkpoint.
"""

from __future__ import annotations

from typing import Any

import attrs

from oasr.errors import ConfigError


def _frozen_dict(value: Any) -> dict[str, Any]:
    return dict(value or {})


@attrs.frozen
class TokenizerSpec:
    """What tokenizer a checkpoint needs.

    ``kind`` names a registered tokenizer kind (``symbol_table``, ``sentencepiece``, ``huggingface``,
    ``whisper``, ``funasr_char``).  ``files`` maps a role (``"units"``, ``"model"``, ``"tokenizer"``)
    to a file path: absolute while converting, relative to the bundle's ``tokenizer/`` folder in a
    native bundle.  ``special_ids`` are ids never shown in text (blank, sos/eos, ...).
    """

    kind: str
    files: dict[str, str] = attrs.field(factory=dict, converter=_frozen_dict)
    special_ids: tuple[int, ...] = ()
    options: dict[str, Any] = attrs.field(factory=dict, converter=_frozen_dict)


@attrs.frozen
class FeatureSpec:
    """The feature frontend a checkpoint was trained with.

    ``kind`` names a registered extractor (``kaldi_fbank``, ``kaldi_mfcc``, ``whisper_logmel``,
    ``nemotron_logmel``).  ``audio_scale`` multiplies [-1, 1] samples before extraction: WeNet and
    FunASR use 32768, icefall, Whisper and NeMo use 1.0; a wrong value silently changes the output.
    ``options`` carries kind-specific fields not covered here.
    """

    kind: str
    sample_rate: int = 16000
    num_mel_bins: int = 80
    frame_length_ms: float = 25.0
    frame_shift_ms: float = 10.0
    dither: float = 0.0
    window_type: str = "povey"
    snip_edges: bool = True
    low_freq: float = 20.0
    high_freq: float = 0.0
    use_energy: bool = False
    num_ceps: int = 13
    preemphasis: float | None = None
    lfr_m: int = 1
    lfr_n: int = 1
    window_seconds: float | None = None
    normalize: str | None = None
    audio_scale: float = 1.0
    options: dict[str, Any] = attrs.field(factory=dict, converter=_frozen_dict)


@attrs.frozen
class DecodingDefaults:
    """How a checkpoint is decoded unless the caller says otherwise.

    ``decode_type`` is the decode method the engine uses unless ``EngineConfig.decode_method`` names
    another (one of the model's ``capabilities``); the ids are the ones the model was trained with,
    for strategies that drop or stop on them.  ``options`` carries family-specific defaults (beam
    sizes, weights).
    """

    decode_type: str
    blank_id: int | None = None
    sos_id: int | None = None
    eos_id: int | None = None
    options: dict[str, Any] = attrs.field(factory=dict, converter=_frozen_dict)


@attrs.frozen
class StreamStateSpec:
    """One fixed-extent per-stream state tensor an encoder needs between chunks.

    ``shape`` is the full tensor shape with the slot (stream) axis at ``slot_axis`` given as 1; the
    engine allocates it with ``max_streams`` there.  Every state of a stream is written when the
    stream is admitted: ``fill_value``, or for a ``persistent`` state the value the encoder's
    ``stream_request_state(options)`` gives it.  ``persistent`` states describe the request, not the
    audio (for example a prompt id), and survive a turn reset; the others are refilled then.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    slot_axis: int = 0
    fill_value: float = 0.0
    persistent: bool = False

    def __attrs_post_init__(self) -> None:
        if not 0 <= self.slot_axis < len(self.shape):
            raise ConfigError(f"StreamStateSpec {self.name!r}: slot_axis {self.slot_axis} outside shape {self.shape}")


@attrs.frozen
class CacheSpec:
    """The paged streaming cache of an encoder: ``num_layers`` attention layers with ``n_kv_head`` ×
    ``head_dim`` K/V, and a convolution tail of ``conv_cache_frames`` frames × ``conv_channels`` per
    layer.  An encoder whose layers differ declares its state as ``slot`` specs instead
    (:class:`StreamStateSpec`, one per tensor, each with its own shape)."""

    num_layers: int = 0
    n_kv_head: int = 0
    head_dim: int = 0
    conv_channels: int = 0
    conv_cache_frames: int = 0


@attrs.frozen
class SmoothGroup:
    """A normalization whose output feeds some linear layers (for SmoothQuant-style scaling)."""

    norm: str
    linears: tuple[str, ...]


@attrs.frozen
class QuantLayout:
    """What a model declares about quantization: smoothable groups, layers kept at full precision, and of those
    the ones a bandwidth-bound path may read as a bfloat16 copy of the weight (``read_bf16``: float32 compute
    over half the bytes, e.g. a one-row decode step's linears; the module's own forward stays float32)."""

    smooth_groups: tuple[SmoothGroup, ...] = ()
    keep_full_precision: tuple[str, ...] = ()
    read_bf16: tuple[str, ...] = ()


@attrs.define
class LoadReport:
    """What ``load_weights`` did with a state dict.

    ``mapped``: checkpoint keys that filled a model tensor; ``dropped``: checkpoint keys nothing
    used; ``missing``: model tensors the checkpoint did not fill (a load error unless computed).
    """

    mapped: list[str] = attrs.field(factory=list)
    dropped: list[str] = attrs.field(factory=list)
    missing: list[str] = attrs.field(factory=list)

    @classmethod
    def build(cls, *, mapped, unexpected=(), dropped=(), missing=()) -> LoadReport:
        dropped_all = sorted(set(dropped) | set(unexpected))
        return cls(mapped=sorted(set(mapped)), dropped=dropped_all, missing=sorted(set(missing)))
