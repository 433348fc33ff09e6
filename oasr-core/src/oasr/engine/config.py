"""EngineConfig: what model to serve and how to batch it."""

from __future__ import annotations

from typing import Any

import attrs
from attrs import validators as v

from oasr.errors import ConfigError

SERVICE_MODES = ("offline", "streaming")
SCHEDULE_POLICIES = ("fcfs", "bucket", "sjf")
QUANTIZATIONS = (None, "int8")


def _positive_or_none(instance, attribute, value) -> None:
    if value is not None and value <= 0:
        raise ValueError(f"must be positive or None, got {value!r}")


class _Checked:
    """A field validator whose failures are :class:`ConfigError` s naming the field; ``options`` are
    the choices of an ``in_`` check (read by :mod:`oasr.engine.flags`)."""

    def __init__(self, check):
        self.check = check
        self.options = getattr(check, "options", None)

    def __call__(self, instance, attribute, value) -> None:
        try:
            self.check(instance, attribute, value)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"EngineConfig.{attribute.name}: {exc}", key=attribute.name) from None


@attrs.define(kw_only=True)
class EngineConfig:
    """Engine construction options.

    ``model`` is a checkpoint directory, a registered alias or a Hugging Face Hub id (None: the
    default alias a model family declares).  Family-specific decode knobs go in ``decode_options``,
    validated by the chosen decode strategy's own options class.
    """

    model: str | None = None
    architecture: str | None = None
    device: str = "cpu"
    #: compute dtype (None: the checkpoint's); float16 / bfloat16 on a GPU only (see oasr.engine.device)
    dtype: str | None = None
    #: weight quantization applied after loading ("int8": per-channel int8 weights, dynamic activations)
    quantization: str | None = attrs.field(default=None, validator=_Checked(v.in_(QUANTIZATIONS)))
    service_mode: str = attrs.field(default="offline", validator=_Checked(v.in_(SERVICE_MODES)))

    # offline batching
    max_batch_size: int = attrs.field(default=16, validator=_Checked(v.ge(1)))
    #: cap on padded feature frames per batch (batch size × longest row); None: no cap
    max_batch_frames: int | None = attrs.field(default=None, validator=_Checked(_positive_or_none))
    #: how long step() waits for a batch to fill before running a partial one (seconds)
    max_wait_time: float = attrs.field(default=0.005, validator=_Checked(v.ge(0)))
    schedule_policy: str = attrs.field(default="bucket", validator=_Checked(v.in_(SCHEDULE_POLICIES)))
    #: bucket policy: the most padding a batch may carry, as a fraction of its real frames
    max_pad_ratio: float = attrs.field(default=0.25, validator=_Checked(v.ge(0)))
    #: a request passed over this many times is scheduled next regardless of policy
    starvation_limit: int = attrs.field(default=4, validator=_Checked(v.ge(0)))
    #: bound on waiting requests; add_request raises EngineFullError beyond it (None: unbounded)
    max_queue: int | None = attrs.field(default=None, validator=_Checked(_positive_or_none))
    #: audio longer than this is refused at admission (None: no limit beyond the model's own)
    max_audio_seconds: float | None = attrs.field(default=None, validator=_Checked(_positive_or_none))
    #: allow long-form decoding past a fixed-window model's window (when the family supports it)
    long_form: bool = True
    #: audio longer than this is cut at VAD silences into segments of at most this many seconds,
    #: decoded as a batch and stitched (None: the model's ``max_segment_seconds``)
    long_form_seconds: float | None = attrs.field(default=None, validator=_positive_or_none)

    #: inference-time options of the model family (validated by the model's options class)
    model_options: dict[str, Any] = attrs.field(factory=dict)
    decode_method: str | None = None
    decode_options: dict[str, Any] = attrs.field(factory=dict)
    #: torch intra-op threads (None: leave torch's setting alone)
    num_threads: int | None = attrs.field(default=None, validator=_Checked(_positive_or_none))

    # streaming
    #: the streaming chunk in the unit the model's streaming_geometry documents (WeNet Conformer: encoder
    #: frames; icefall Zipformer: icefall's --chunk-size, 50 Hz embed frames); None: the encoder's own
    #: ``default_chunk_size`` (the geometry its releases are published at)
    chunk_size: int | None = attrs.field(default=None, validator=_Checked(_positive_or_none))
    #: left chunks of attention context kept per stream (-1: unlimited)
    num_left_chunks: int = -1
    max_streams: int = attrs.field(default=32, validator=_Checked(v.ge(1)))
    #: a stream longer than this many seconds finishes with finish_reason="length"
    max_stream_seconds: float = attrs.field(default=600.0, validator=_Checked(v.gt(0)))
    #: on a GPU, replay the streaming chunk step from CUDA graphs (one per batch size) where the
    #: encoder allows it (see oasr.engine.graphs); False: always run it eagerly
    cuda_graphs: bool = True
