"""The decode strategy contract: how the engine turns model outputs into hypotheses.

A strategy serves one decode family (``ctc``, ``ctc_aed_rescoring``, ``aed``, ...), is registered
through the ``oasr_register_decoders`` hook, and calls :func:`require_capability` once, at
construction.  It receives a batch of requests (features and/or waveforms plus each request's
:class:`DecodingOptions`) and returns one :class:`Hypothesis` per row — or an exception for a row
that failed, which fails that request alone.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import attrs
import torch

from oasr import serde
from oasr.decoding.types import Hypothesis, Segment
from oasr.engine.options import DecodingOptions
from oasr.errors import RequestError
from oasr.models.base import BaseAsrModel
from oasr.models.interfaces import require_capability
from oasr.models.specs import DecodingDefaults


@attrs.define
class NoOptions:
    """A strategy with no engine-level options."""


@attrs.define
class DecodeContext:
    """Everything a strategy may use besides the batch."""

    model: BaseAsrModel
    tokenizer: Any
    decoding_defaults: DecodingDefaults
    feature_config: Any
    device: torch.device
    #: seconds per feature frame (before subsampling)
    frame_shift: float = 0.01
    sample_rate: int = 16000
    source: Path | None = None


@attrs.define
class DecodeBatch:
    """One batch of requests handed to a strategy.

    ``feats``/``feat_lens`` are set when the strategy ``needs_features``; ``waveforms`` (1-D float
    tensors at the model's sample rate, unscaled) are always there.
    """

    request_ids: list[str]
    options: list[DecodingOptions]
    waveforms: list[torch.Tensor]
    feats: torch.Tensor | None = None
    feat_lens: torch.Tensor | None = None
    #: seconds spent per stage ("encoder", "decode"); a strategy adds what it measures
    timings: dict[str, float] = attrs.field(factory=dict)
    #: set by the engine: a strategy that decodes a row window by window may call
    #: ``on_segments(row, segments, seconds_done, language)`` each time segments of that row are final,
    #: before the row's Hypothesis is returned (``seconds_done``: how much of the row's audio is decoded)
    on_segments: Callable[[int, list[Segment], float, str | None], None] | None = None

    def __len__(self) -> int:
        return len(self.request_ids)


class DecodeStrategy:
    #: the decode family this strategy serves
    family: ClassVar[str] = ""
    #: attrs class of the engine-level options (EngineConfig.decode_options)
    options_class: ClassVar[type] = NoOptions
    #: DecodingOptions fields this family honours when set to a non-default value
    supported_options: ClassVar[frozenset[str]] = frozenset()
    #: whether the engine computes features for the batch (False: the strategy reads waveforms)
    needs_features: ClassVar[bool] = True
    #: whether the family decodes audio longer than the model's fixed window itself
    supports_long_form: ClassVar[bool] = False

    def __init__(self, ctx: DecodeContext, options: Any = None):
        require_capability(ctx.model, self.family)
        self.ctx = ctx
        self.options = options if options is not None else self.options_class()

    @classmethod
    def parse_options(cls, raw: dict[str, Any] | Any | None) -> Any:
        """Engine-level options from a dict; an unknown key raises naming the valid ones."""
        return serde.structure_options(raw, cls.options_class, what=f"decode option(s) for decode method {cls.family!r}")

    def validate(self, options: DecodingOptions, request_id: str | None = None) -> None:
        """Refuse, at admission, a request asking for something this family cannot honour."""
        unsupported = sorted(options.requested() - set(self.supported_options))
        if unsupported:
            raise RequestError(
                f"decode method {self.family!r} of {type(self.ctx.model).__name__} cannot honour "
                f"{', '.join(unsupported)}; it supports: {', '.join(sorted(self.supported_options)) or '(no options)'}",
                request_id=request_id,
                param=unsupported[0],
            )

    def decode(self, batch: DecodeBatch) -> list[Hypothesis | BaseException]:
        raise NotImplementedError

    # -- streaming ---------------------------------------------------------------------------------
    def stream_search(self, options: DecodingOptions) -> Any:
        """A per-stream search: ``advance(log_probs (T, V))``, ``best() -> Hypothesis`` (the partial),
        ``final(hidden_chunks, frame_seconds) -> Hypothesis`` and ``keeps_hidden`` (whether the
        stream must keep its encoder output for ``final``).  Families that cannot stream keep this."""
        raise NotImplementedError(f"decode method {self.family!r} has no streaming search")

    def supports_streaming(self) -> bool:
        return type(self).stream_search is not DecodeStrategy.stream_search
