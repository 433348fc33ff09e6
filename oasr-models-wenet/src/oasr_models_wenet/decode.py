"""The ``ctc_aed_rescoring`` decode strategy (WeNet's ``attention_rescoring``).

Per request: the CTC prefix-beam n-best (``beam_size`` hypotheses) over the encoder output, then one
batched teacher-forced pass of the attention decoder over every hypothesis of the batch
(``model.decoder.rescore``); each hypothesis scores

    attention (left, mixed with ``reverse_weight`` of the right-to-left decoder) + ``ctc_weight`` · CTC

and the best one wins, carrying its CTC emission frames.  Defaults come from the checkpoint's
:class:`DecodingDefaults` (WeNet runtime's ``ctc_weight`` 0.5, the trained ``reverse_weight``, beam 10).

Streaming (:meth:`CtcAedRescoringStrategy.stream_search`) is WeNet's U2++ recipe: the prefix beam
advances chunk by chunk (its best prefix is the partial result), and when the stream ends its n-best
is rescored once over the stream's whole encoder output.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict

import attrs
import torch

from oasr.decoding.types import Hypothesis
from oasr.engine.decode.base import DecodeBatch, DecodeContext, DecodeStrategy
from oasr.engine.options import DecodingOptions
from oasr.errors import RequestError


def _optional_non_negative(instance, attribute, value) -> None:
    if value is not None and value < 0:
        raise ValueError(f"{attribute.name} must be >= 0, got {value}")


@attrs.define
class CtcAedRescoringOptions:
    """Engine-level options; None takes the checkpoint's decoding defaults."""

    beam_size: int | None = attrs.field(default=None, validator=attrs.validators.optional(attrs.validators.ge(1)))
    ctc_weight: float | None = attrs.field(default=None, validator=_optional_non_negative)
    reverse_weight: float | None = attrs.field(default=None, validator=_optional_non_negative)


class CtcAedRescoringStrategy(DecodeStrategy):
    family = "ctc_aed_rescoring"
    options_class = CtcAedRescoringOptions
    supported_options = frozenset({"beam_size", "n_best"})
    needs_features = True

    def __init__(self, ctx: DecodeContext, options: CtcAedRescoringOptions | None = None):
        super().__init__(ctx, options)
        defaults = ctx.decoding_defaults.options
        decoder = ctx.model.decoder
        self.beam_size = int(self.options.beam_size or defaults.get("beam_size", 10))
        self.ctc_weight = float(self.options.ctc_weight if self.options.ctc_weight is not None
                                else defaults.get("ctc_weight", 0.5))
        self.reverse_weight = float(self.options.reverse_weight if self.options.reverse_weight is not None
                                    else defaults.get("reverse_weight", decoder.config.reverse_weight))
        blank = ctx.decoding_defaults.blank_id
        self.blank_id = int(blank if blank is not None else 0)
        self.seconds_per_frame = ctx.model.encoder.subsampling_rate * ctx.frame_shift

    def validate(self, options: DecodingOptions, request_id: str | None = None) -> None:
        super().validate(options, request_id)
        beam = options.beam_size or self.beam_size
        if options.n_best > beam:
            raise RequestError(f"n_best={options.n_best} exceeds the rescored beam of {beam}; raise beam_size",
                               request_id=request_id, param="n_best")

    def decode(self, batch: DecodeBatch) -> list[Hypothesis | BaseException]:
        from oasr.decoding.ctc import ctc_prefix_beam_search

        model = self.ctx.model
        device = self.ctx.device
        t0 = time.perf_counter()
        with torch.inference_mode():
            hidden, lens = model.encode_offline(batch.feats.to(device), batch.feat_lens.to(device))
            log_probs = model.ctc_log_probs(hidden)
        t1 = time.perf_counter()
        results: list[Hypothesis | BaseException | None] = [None] * len(batch)
        nbests: dict[int, list[Hypothesis]] = {}
        by_beam: dict[int, list[int]] = defaultdict(list)
        for row, opts in enumerate(batch.options):
            by_beam[opts.beam_size or self.beam_size].append(row)
        for beam, rows in by_beam.items():
            index = torch.tensor(rows, device=log_probs.device)
            try:
                found = ctc_prefix_beam_search(log_probs.index_select(0, index).cpu(), lens.index_select(0, index).cpu(),
                                               beam_size=beam, n_best=beam, blank=self.blank_id)
            except Exception as exc:  # a failing search fails its requests, not the batch
                for row in rows:
                    results[row] = exc
                continue
            for row, nbest in zip(rows, found, strict=True):
                nbests[row] = list(nbest)
        rows = sorted(nbests)
        if rows:
            index = torch.tensor(rows, device=hidden.device)
            with torch.inference_mode():
                rescored = model.decoder.rescore(hidden.index_select(0, index), lens.index_select(0, index),
                                                 [[h.tokens for h in nbests[r]] for r in rows],
                                                 reverse_weight=self.reverse_weight)
            for row, scored in zip(rows, rescored, strict=True):
                results[row] = self._pick(nbests[row], scored, batch.options[row].n_best)
        batch.timings["encoder"] = t1 - t0
        batch.timings["decode"] = time.perf_counter() - t1
        return results  # type: ignore[return-value]

    def stream_search(self, options: DecodingOptions) -> RescoringStreamSearch:
        return RescoringStreamSearch(self, options)

    def rescore_one(self, memory: torch.Tensor, nbest: list[Hypothesis], n_best: int) -> Hypothesis:
        """Rescore one utterance's CTC n-best against its encoder output ``memory`` (T, D)."""
        with torch.inference_mode():
            (scored,) = self.ctx.model.decoder.rescore(
                memory[None], torch.tensor([memory.size(0)], device=memory.device), [[h.tokens for h in nbest]],
                reverse_weight=self.reverse_weight)
        return self._pick(nbest, scored, n_best)

    def _pick(self, nbest: list[Hypothesis], scored, n_best: int) -> Hypothesis:
        ctc = torch.tensor([h.score for h in nbest], dtype=torch.float64)
        # WeNet adds the float64 CTC term to the float32 attention score in float32
        totals = scored.scores.float().cpu() + (ctc * self.ctc_weight).float()
        order = sorted(range(len(nbest)), key=lambda i: -float(totals[i]))
        out = [self._hypothesis(nbest[i], float(totals[i]), float(scored.scores[i]), scored.token_confidences[i])
               for i in order[:max(1, n_best)]]
        best = out[0]
        if n_best > 1:
            best.nbest = out
        return best

    def _hypothesis(self, ctc_hyp: Hypothesis, total: float, attention: float,
                    token_confidences: list[float]) -> Hypothesis:
        tokens = list(ctc_hyp.tokens)
        frames = list(ctc_hyp.token_frames) if ctc_hyp.token_frames is not None else None
        return Hypothesis(
            tokens=tokens,
            score=total,
            token_frames=frames,
            token_times=[f * self.seconds_per_frame for f in frames] if frames is not None else None,
            token_confidences=token_confidences,
            confidence=math.exp(attention / (len(tokens) + 1)),
        )


class RescoringStreamSearch:
    """Per-stream search of ``ctc_aed_rescoring``: ``advance(log_probs (T, V))``, ``best()`` (the
    partial: the leading CTC prefix), ``final(hidden_chunks, frame_seconds)`` (the rescored n-best)."""

    keeps_hidden = True

    def __init__(self, strategy: CtcAedRescoringStrategy, options: DecodingOptions):
        from oasr.decoding.ctc import CtcPrefixBeamState

        self.strategy = strategy
        self.options = options
        self.beam = options.beam_size or strategy.beam_size
        self.state = CtcPrefixBeamState(beam_size=self.beam, blank=strategy.blank_id)

    def advance(self, log_probs: torch.Tensor) -> None:
        self.state.advance(log_probs)

    def best(self) -> Hypothesis:
        results = self.state.results(1)
        return results[0] if results else Hypothesis(tokens=[])

    def final(self, hidden: list[torch.Tensor], frame_seconds: float) -> Hypothesis:
        nbest = self.state.results(self.beam)
        if not nbest or not hidden:
            return self.best()
        return self.strategy.rescore_one(torch.cat(hidden), list(nbest), self.options.n_best)
