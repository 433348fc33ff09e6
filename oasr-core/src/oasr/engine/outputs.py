"""How outputs leave the engine: built from a strategy's Hypothesis, handed to a request's callback."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from oasr.decoding.types import Hypothesis, Segment
from oasr.engine.options import DecodingOptions, RequestOutput

logger = logging.getLogger("oasr.engine")

OutputCallback = Callable[[RequestOutput], None]


def deliver(callback: OutputCallback | None, output: RequestOutput) -> None:
    """Hand an output to a request's callback; a callback that raises is logged, never propagated
    into the step that produced the output (it would fail every other request of the batch)."""
    if callback is None:
        return
    try:
        callback(output)
    except Exception:
        logger.exception("output callback of request %s raised", output.request_id)


def build_output(request_id: str, hyp: Hypothesis, tokenizer: Any, options: DecodingOptions,
                 duration: float | None, *, finished: bool = True) -> RequestOutput:
    """A RequestOutput from a strategy's Hypothesis (detokenizing if the strategy did not)."""
    text = hyp.text if hyp.text is not None else tokenizer.decode(hyp.tokens)
    words = hyp.words if options.word_timestamps else None
    segments = hyp.segments
    if segments is None and finished:
        segments = [Segment(0, 0.0, round(duration or 0.0, 3), text, list(hyp.tokens), words=words)]
    nbest = None
    if hyp.nbest and options.n_best > 1:
        nbest = [h.text if h.text is not None else tokenizer.decode(h.tokens) for h in hyp.nbest]
    return RequestOutput(request_id, text=text, tokens=list(hyp.tokens), words=words, segments=segments,
                         confidence=hyp.confidence, language=hyp.language, finished=finished,
                         finish_reason="stop" if finished else None, duration=duration, nbest=nbest,
                         tags=hyp.tags)
