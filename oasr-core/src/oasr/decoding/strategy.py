"""The decode strategy contract: how the engine turns model outputs into hypotheses.

A strategy serves one decode method (``ctc``, ``ctc_aed_rescoring``, ``aed``, ...), is registered
through the ``oasr_register_decoders`` hook, and declares in :attr:`DecodeStrategy.requires` every
model member it reads (and why); the check runs once, when the engine builds the strategy.  It
receives a batch of requests (features and/or waveforms plus each request's
:class:`DecodingOptions`) and returns one :class:`Hypothesis` per row — or an exception for a row
that failed, which fails that request alone.

Streaming works over encoder frames: the engine's streaming executor hands each chunk's hidden
states to :meth:`DecodeStrategy.advance_streams`, and the strategy's :class:`StreamSearch` applies
its own head (a CTC projection, a predictor and joiner, ...).  The executor knows no head.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import attrs
import torch

from oasr import serde
from oasr.decoding.types import Hypothesis, Segment
from oasr.errors import RequestError
from oasr.models.base import BaseAsrModel
from oasr.models.interfaces import Requirement, check_requirements
from oasr.models.specs import DecodingDefaults

if TYPE_CHECKING:
    from oasr.engine.options import DecodingOptions


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


class StreamSearch(Protocol):
    """The search state of one stream, fed the stream's encoder frames chunk by chunk.

    ``advance`` receives the chunk's hidden states (T, D) and applies the strategy's own head;
    ``best`` is the partial result; ``final`` the result once the audio ended, given the stream's
    kept encoder output (only when ``keeps_hidden``; otherwise an empty list).
    """

    keeps_hidden: bool

    def advance(self, hidden: torch.Tensor) -> None: ...

    def best(self) -> Hypothesis: ...

    def final(self, hidden: list[torch.Tensor], frame_seconds: float) -> Hypothesis: ...


class DecodeStrategy:
    #: the decode method this strategy serves (the name it is registered under)
    family: ClassVar[str] = ""
    #: model members offline decoding reads, each with the reason; checked at engine construction
    requires: ClassVar[tuple[Requirement, ...]] = ()
    #: further members streaming reads (checked when the engine is built for streaming)
    stream_requires: ClassVar[tuple[Requirement, ...]] = ()
    #: attrs class of the engine-level options (EngineConfig.decode_options)
    options_class: ClassVar[type] = NoOptions
    #: DecodingOptions fields this family honours when set to a non-default value
    supported_options: ClassVar[frozenset[str]] = frozenset()
    #: whether the engine computes features for the batch (False: the strategy reads waveforms)
    needs_features: ClassVar[bool] = True
    #: whether the family decodes audio longer than the model's fixed window itself
    supports_long_form: ClassVar[bool] = False

    def __init__(self, ctx: DecodeContext, options: Any = None):
        check_requirements(ctx.model, self.requires, method=self.family)
        self.ctx = ctx
        self.options = options if options is not None else self.options_class()

    @classmethod
    def parse_options(cls, raw: dict[str, Any] | Any | None) -> Any:
        """Engine-level options from a dict; an unknown key raises naming the valid ones."""
        return serde.structure_options(raw, cls.options_class, what=f"decode option(s) for decode method {cls.family!r}")

    def honoured_options(self) -> frozenset[str]:
        """The request fields this strategy honours, plus those the model's encoder honours itself."""
        return self.supported_options | self.ctx.model.encoder_options

    def validate(self, options: DecodingOptions, request_id: str | None = None) -> None:
        """Refuse, at admission, a request asking for something this family cannot honour."""
        honoured = self.honoured_options()
        unsupported = sorted(options.requested() - set(honoured))
        if unsupported:
            raise RequestError(
                f"decode method {self.family!r} of {type(self.ctx.model).__name__} cannot honour "
                f"{', '.join(unsupported)}; it supports: {', '.join(sorted(honoured)) or '(no options)'}",
                request_id=request_id,
                param=unsupported[0],
            )

    def plan_options(self, options: DecodingOptions, pieces: Iterable[torch.Tensor]) -> DecodingOptions:
        """The options every piece of one long-form request is decoded with, given the pieces' audio in
        order (each made as it is iterated); called once per request at admission.  Default: the request's
        own.  A family that decides something once per request rather than per piece (its language)
        returns the options with it set."""
        return options

    def decode(self, batch: DecodeBatch) -> list[Hypothesis | BaseException]:
        raise NotImplementedError

    # -- streaming ---------------------------------------------------------------------------------
    @classmethod
    def supports_streaming(cls) -> bool:
        return cls.stream_search is not DecodeStrategy.stream_search

    def check_streaming(self) -> None:
        """Raise :class:`CapabilityError` unless this strategy can stream this model."""
        from oasr.errors import CapabilityError

        if not self.supports_streaming():
            raise CapabilityError(f"decode method {self.family!r} has no streaming search; use "
                                  f"service_mode='offline' or a decode method that streams", capability="streaming")
        check_requirements(self.ctx.model, self.stream_requires, method=self.family, what="stream")

    def stream_search(self, options: DecodingOptions) -> StreamSearch:
        """A new per-stream search for a request with ``options``.  Families that cannot stream keep this."""
        raise NotImplementedError(f"decode method {self.family!r} has no streaming search")

    def advance_streams(self, searches: Sequence[StreamSearch], hidden: torch.Tensor,
                        lengths: Sequence[int]) -> None:
        """Advance each stream's search by its row of a chunk's hidden states (B, T, D), ``lengths[b]``
        valid frames each (rows with none are skipped).  Override to apply the head once per chunk."""
        for row, search in enumerate(searches):
            if lengths[row]:
                search.advance(hidden[row, : lengths[row]])
