"""The ``ctc`` decode strategy: greedy or prefix-beam search over the model's CTC log-probs.

Offline it reads the fused encoder + CTC head (``forward_offline``); streaming it applies the CTC
projection (``ctc_log_probs``) to each chunk's encoder frames, once for every stream of the chunk.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Literal

import attrs
import torch

from oasr.decoding.strategy import DecodeBatch, DecodeStrategy
from oasr.decoding.types import Hypothesis
from oasr.errors import RequestError
from oasr.models.interfaces import Requirement

CTC_STREAM_REQUIRES = (
    Requirement("ctc_log_probs", "streaming applies the CTC projection to each chunk's encoder frames (B, T, D)"),
)


def advance_ctc_searches(model: Any, searches: Sequence[Any], hidden: torch.Tensor, lengths: Sequence[int]) -> None:
    """One CTC projection over a chunk's hidden states, then each stream's search advances by its
    row's log-probs (``search.advance_log_probs``)."""
    log_probs = model.ctc_log_probs(hidden).float().cpu()
    for row, search in enumerate(searches):
        if lengths[row]:
            search.advance_log_probs(log_probs[row, : lengths[row]])


@attrs.define
class CtcOptions:
    #: "greedy", or "prefix_beam"; a request asking beam_size > 1 or n_best > 1 gets prefix beam
    search: Literal["greedy", "prefix_beam"] = "greedy"
    beam_size: int = 10
    #: skip frames whose blank posterior exceeds this (speeds up beam search; None: never)
    blank_skip_threshold: float | None = None
    #: bonus per matched hotword token in context biasing
    hotword_score: float = 1.5


class CtcDecodeStrategy(DecodeStrategy):
    family = "ctc"
    requires = (Requirement("forward_offline", "CTC search reads per-frame log-probs (B, T', V) and their lengths "
                                               "from the fused encoder + CTC head"),)
    stream_requires = CTC_STREAM_REQUIRES
    options_class = CtcOptions
    supported_options = frozenset({"word_timestamps", "beam_size", "n_best", "hotwords"})

    def validate(self, options, request_id=None) -> None:
        super().validate(options, request_id)
        beam = options.beam_size if (options.beam_size or 1) > 1 else self.options.beam_size
        if options.n_best > beam:
            raise RequestError(f"n_best={options.n_best} exceeds the beam size {beam}; raise beam_size",
                               request_id=request_id, param="n_best")
        if options.hotwords:
            try:
                self._hotword_ids(options.hotwords)
            except Exception as exc:
                raise RequestError(f"hotwords cannot be tokenized by this model's tokenizer: {exc}",
                                   request_id=request_id, param="hotwords") from exc

    def stream_search(self, options) -> CtcStreamSearch:
        return CtcStreamSearch(self, options)

    def advance_streams(self, searches, hidden, lengths) -> None:
        advance_ctc_searches(self.ctx.model, searches, hidden, lengths)

    def _beam(self, options) -> bool:
        return (self.options.search == "prefix_beam" or (options.beam_size or 1) > 1 or options.n_best > 1
                or bool(options.hotwords))

    def context_graph(self, hotwords):
        from oasr.decoding.context import ContextGraph

        return ContextGraph(self._hotword_ids(hotwords), score=self.options.hotword_score)

    def _hotword_ids(self, hotwords) -> list[list[int]]:
        return [self.ctx.tokenizer.encode(word) for word in hotwords]

    @property
    def blank_id(self) -> int:
        blank = self.ctx.decoding_defaults.blank_id
        return 0 if blank is None else int(blank)

    def frame_seconds(self) -> float:
        return self.ctx.frame_shift * self.ctx.model.encoder.subsampling_rate

    def decode(self, batch: DecodeBatch) -> list[Hypothesis | BaseException]:
        t0 = time.perf_counter()
        log_probs, lengths = self.ctx.model.forward_offline(batch.feats, batch.feat_lens)
        # log-probs stay on the model's device: core's CTC searches use a device kernel when one is
        # registered (oasr-kernels' @cuda variants) and copy to the host otherwise
        log_probs = log_probs.float()
        lengths = lengths.cpu()
        t1 = time.perf_counter()
        results = self.search(log_probs, lengths, batch.options)
        batch.timings["encoder"] = t1 - t0
        batch.timings["decode"] = time.perf_counter() - t1
        return results

    def search(self, log_probs, lengths, options_list) -> list[Hypothesis]:
        """Search each row by its own options (rows asking the same search run batched)."""
        from oasr.decoding.ctc import ctc_greedy_search, ctc_prefix_beam_search

        results: list[Hypothesis | None] = [None] * len(options_list)
        greedy_rows = [i for i, o in enumerate(options_list) if not self._beam(o)]
        if greedy_rows:
            hyps = ctc_greedy_search(log_probs[greedy_rows], lengths[greedy_rows], blank=self.blank_id)
            for i, hyp in zip(greedy_rows, hyps, strict=True):
                results[i] = hyp
        groups: dict[tuple, list[int]] = {}
        for i, o in enumerate(options_list):
            if self._beam(o):
                beam = o.beam_size if (o.beam_size or 1) > 1 else self.options.beam_size
                groups.setdefault((beam, o.n_best, o.hotwords), []).append(i)
        for (beam, n_best, hotwords), rows in groups.items():
            context = self.context_graph(hotwords) if hotwords else None
            nbests = ctc_prefix_beam_search(log_probs[rows], lengths[rows], beam_size=beam, n_best=max(n_best, 1),
                                            blank=self.blank_id,
                                            blank_skip_threshold=self.options.blank_skip_threshold, context=context)
            for i, nbest in zip(rows, nbests, strict=True):
                best = nbest[0] if nbest else Hypothesis(tokens=[])
                best.nbest = nbest
                results[i] = best
        frame = self.frame_seconds()
        for hyp, opts in zip(results, options_list, strict=True):
            self._finish_hypothesis(hyp, frame, opts)
        return results

    def _finish_hypothesis(self, hyp: Hypothesis, frame: float, options) -> None:
        from oasr.decoding.words import finish_frame_hypothesis

        finish_frame_hypothesis(hyp, frame, self.ctx.tokenizer, word_timestamps=options.word_timestamps)


class CtcStreamSearch:
    """Per-stream CTC search state: incremental greedy or prefix beam.

    Nothing proportional to the vocabulary is kept per frame, and no encoder output is kept.
    """

    keeps_hidden = False

    def __init__(self, strategy: CtcDecodeStrategy, options):
        self.strategy = strategy
        self.options = options
        self.blank = strategy.blank_id
        self.state = None
        if strategy._beam(options):
            from oasr.decoding.ctc import CtcPrefixBeamState

            beam = options.beam_size if (options.beam_size or 1) > 1 else strategy.options.beam_size
            self.n_best = options.n_best
            context = strategy.context_graph(options.hotwords) if options.hotwords else None
            self.state = CtcPrefixBeamState(beam_size=beam, blank=self.blank, context=context,
                                            blank_skip_threshold=strategy.options.blank_skip_threshold)
        self.tokens: list[int] = []
        self.frames: list[int] = []
        self.confidences: list[float] = []
        self.prev = self.blank
        self.seen = 0

    def advance(self, hidden: torch.Tensor) -> None:
        """One chunk's encoder frames (T, D) of this stream."""
        self.advance_log_probs(self.strategy.ctx.model.ctc_log_probs(hidden[None])[0].float().cpu())

    def advance_log_probs(self, log_probs: torch.Tensor) -> None:
        """One chunk's CTC log-probs (T, V) of this stream."""
        if self.state is not None:
            self.state.advance(log_probs)
        else:
            best, ids = log_probs.max(-1)
            for t, (token, score) in enumerate(zip(ids.tolist(), best.exp().tolist(), strict=True)):
                if token != self.blank and token != self.prev:
                    self.tokens.append(token)
                    self.frames.append(self.seen + t)
                    self.confidences.append(score)
                self.prev = token
        self.seen += log_probs.shape[0]

    def best(self) -> Hypothesis:
        if self.state is not None:
            results = self.state.results(1)
            return results[0] if results else Hypothesis(tokens=[])
        return Hypothesis(tokens=list(self.tokens), token_frames=list(self.frames),
                          token_confidences=list(self.confidences))

    def final(self, hidden: list[torch.Tensor], frame_seconds: float) -> Hypothesis:
        if self.state is not None:
            nbest = self.state.results(self.n_best)
            hyp = nbest[0] if nbest else Hypothesis(tokens=[])
            hyp.nbest = nbest
        else:
            hyp = self.best()
        self.strategy._finish_hypothesis(hyp, frame_seconds, self.options)
        return hyp
