"""The ``transducer`` decode strategy: greedy or beam search over a predictor and a joiner.

Offline it runs the encoder (``encode_offline``), projects every frame once
(``joiner.project_encoder``) and searches the batch (rows finish independently).  Streaming it
projects each chunk's hidden states once for all streams of the chunk and advances each stream's
search by its rows.  The model contract is :mod:`oasr.models.transducer`.

Which search a request gets: greedy unless the engine option ``search`` is ``"modified_beam"`` or the
request asks ``beam_size > 1``, ``n_best > 1`` or hotwords.  The beam search is icefall's modified beam
search (:mod:`oasr.decoding.transducer`, label-window predictors, hotwords) for an RNN-T joint, and
NeMo's TDT beam search (:mod:`oasr.decoding.tdt_beam`, any predictor, no hotwords) for a joint with
duration logits; ``search="maes"`` picks NeMo's mAES over the TDT joint instead.  Checkpoint defaults
(``DecodingDefaults.options``: ``unk_id``, ``max_symbols``, ``beam_size``, ``hotword_score``,
``search``) stand in for options the engine configuration leaves unset.
"""

from __future__ import annotations

import time
from typing import Any, Literal

import attrs
import torch

from oasr.decoding.strategy import DecodeBatch, DecodeContext, DecodeStrategy
from oasr.decoding.types import Hypothesis
from oasr.errors import ConfigError, RequestError
from oasr.models.interfaces import Requirement

#: the class defaults of the options left as None in :class:`TransducerOptions`
DEFAULTS = {"search": "greedy", "beam_size": 4, "max_symbols": 1, "hotword_score": 1.5}


@attrs.define
class TransducerOptions:
    #: "greedy", "modified_beam" or (TDT only) "maes" (None: the checkpoint's, else greedy); a request asking
    #: beam_size > 1, n_best > 1 or hotwords gets beam search (a TDT joint: NeMo's TDT beam search, "default"
    #: unless "maes")
    search: Literal["greedy", "modified_beam", "maes"] | None = None
    #: beam of modified beam search (None: the checkpoint's, else 4)
    beam_size: int | None = None
    #: labels emitted per frame at most, greedy (None: the checkpoint's, else 1)
    max_symbols: int | None = None
    #: bonus per matched hotword token in context biasing (None: the checkpoint's, else 1.5)
    hotword_score: float | None = None


class TransducerDecodeStrategy(DecodeStrategy):
    family = "transducer"
    requires = (
        Requirement("encode_offline", "the searches read the encoder's hidden states (B, T', D) and lengths"),
        Requirement("predictor", "a TransducerPredictor (init_state / predict / advance / select) feeds the joint"),
        Requirement("joiner", "a TransducerJoiner (project_encoder / project_predictor / joint) scores labels"),
    )
    stream_requires = (
        Requirement("joiner.project_encoder", "streaming projects each chunk's encoder frames once for all streams"),
    )
    options_class = TransducerOptions
    supported_options = frozenset({"word_timestamps", "beam_size", "n_best", "hotwords"})

    def __init__(self, ctx: DecodeContext, options: Any = None):
        super().__init__(ctx, options)
        explicit_beam = self.options.beam_size
        self.options = self._resolve(self.options, dict(ctx.decoding_defaults.options or {}))
        self.predictor = ctx.model.predictor
        self.joiner = ctx.model.joiner
        unk = ctx.decoding_defaults.options.get("unk_id") if ctx.decoding_defaults.options else None
        self.unk_id = None if unk is None else int(unk)
        search = self.options.search
        asked = ("search", f"search={search!r}") if search in ("modified_beam", "maes") else (
            ("beam_size", f"beam_size={explicit_beam}") if explicit_beam is not None and explicit_beam > 1 else None)
        reason = self._beam_refusal() if asked else None
        if reason:
            raise ConfigError(f"decode option {asked[1]} is refused: {reason}", key=asked[0])

    @staticmethod
    def _resolve(options: TransducerOptions, checkpoint: dict[str, Any]) -> TransducerOptions:
        values = {}
        for name, default in DEFAULTS.items():
            value = getattr(options, name)
            if value is None:
                value = checkpoint.get(name, default)
            values[name] = value
        if values["search"] not in ("greedy", "modified_beam", "maes"):
            raise ConfigError(f"decode option search must be 'greedy', 'modified_beam' or 'maes', got "
                              f"{values['search']!r}", key="search")
        for name in ("beam_size", "max_symbols"):
            if int(values[name]) < 1:
                raise ConfigError(f"decode option {name} must be at least 1, got {values[name]}", key=name)
            values[name] = int(values[name])
        values["hotword_score"] = float(values["hotword_score"])
        return TransducerOptions(**values)

    # -- admission ------------------------------------------------------------------------------------
    def _tdt(self) -> bool:
        return bool(getattr(self.joiner, "durations", ()))

    def _beam_refusal(self) -> str | None:
        """Why beam search cannot run on this model (None: it can)."""
        if self._tdt():
            return None  # TDT beam search keeps one predictor state per label sequence: any predictor
        if self.options.search == "maes":
            return "mAES is NeMo's search over a TDT joint, and this joint has no duration logits"
        if not getattr(self.predictor, "label_window_state", False):
            return (f"{type(self.predictor).__name__} keeps a recurrent state (label_window_state is False), and "
                    f"modified beam search needs a label-window state; decode it greedily (beam_size 1)")
        return None

    def validate(self, options, request_id=None) -> None:
        super().validate(options, request_id)
        # a prompted encoder refuses what it cannot honour (an unknown language) here, at admission
        check = getattr(self.ctx.model, "validate_encoder_request", None)
        if check is not None:
            check(options, request_id)
        beam = self._beam_size(options)
        if options.n_best > beam:
            raise RequestError(f"n_best={options.n_best} exceeds the beam size {beam}; raise beam_size",
                               request_id=request_id, param="n_best")
        if self._beam(options):
            reason = self._beam_refusal()
            if reason:
                param = ("beam_size" if (options.beam_size or 1) > 1 else "n_best" if options.n_best > 1
                         else "hotwords" if options.hotwords else "beam_size")
                raise RequestError(f"beam search (beam_size > 1, n_best > 1 or hotwords) is refused: {reason}",
                                   request_id=request_id, param=param)
        if options.hotwords and self._tdt():
            raise RequestError("hotwords (context biasing) are not supported by TDT beam search; leave hotwords "
                               "unset for this TDT model", request_id=request_id, param="hotwords")
        if options.hotwords:
            try:
                self._hotword_ids(options.hotwords)
            except Exception as exc:
                raise RequestError(f"hotwords cannot be tokenized by this model's tokenizer: {exc}",
                                   request_id=request_id, param="hotwords") from exc

    def _beam(self, options) -> bool:
        return (self.options.search in ("modified_beam", "maes") or (options.beam_size or 1) > 1
                or options.n_best > 1 or bool(options.hotwords))

    @property
    def tdt_search(self) -> str:
        """NeMo's ``search_type`` of the TDT beam search: ``"maes"`` or ``"default"``."""
        return "maes" if self.options.search == "maes" else "default"

    def _beam_size(self, options) -> int:
        return options.beam_size if (options.beam_size or 1) > 1 else self.options.beam_size

    def _hotword_ids(self, hotwords) -> list[list[int]]:
        ids = [list(self.ctx.tokenizer.encode(word)) for word in hotwords]
        for word, tokens in zip(hotwords, ids, strict=True):
            if not tokens:
                raise ValueError(f"hotword {word!r} has no tokens")
        return ids

    def context_graph(self, hotwords):
        from oasr.decoding.context import ContextGraph

        return ContextGraph(self._hotword_ids(hotwords), score=self.options.hotword_score)

    @property
    def blank_id(self) -> int:
        blank = self.ctx.decoding_defaults.blank_id
        return int(self.predictor.blank_id) if blank is None else int(blank)

    def frame_seconds(self) -> float:
        return self.ctx.frame_shift * self.ctx.model.encoder.subsampling_rate

    # -- offline --------------------------------------------------------------------------------------
    def decode(self, batch: DecodeBatch) -> list[Hypothesis | BaseException]:
        t0 = time.perf_counter()
        # per-row encoder inputs of a prompted encoder (None: no row asks for one, the plain call)
        conditioning = getattr(self.ctx.model, "encoder_conditioning", None)
        extra = conditioning(batch.options) if conditioning is not None else None
        hidden, lengths = self.ctx.model.encode_offline(batch.feats, batch.feat_lens, **(extra or {}))
        enc_proj = self.joiner.project_encoder(hidden)
        t1 = time.perf_counter()
        results = self.search(enc_proj, lengths.cpu(), batch.options)
        batch.timings["encoder"] = t1 - t0
        batch.timings["decode"] = time.perf_counter() - t1
        return results

    def search(self, enc_proj: torch.Tensor, lengths: torch.Tensor, options_list) -> list[Hypothesis]:
        """Search each row of the projected frames by its own options (rows asking the same search run batched)."""
        from oasr.decoding.tdt_search import tdt_beam_search
        from oasr.decoding.transducer import transducer_greedy_search, transducer_modified_beam_search

        results: list[Hypothesis | None] = [None] * len(options_list)
        greedy_rows = [i for i, o in enumerate(options_list) if not self._beam(o)]
        if greedy_rows:
            index = torch.tensor(greedy_rows, dtype=torch.long, device=enc_proj.device)
            hyps = transducer_greedy_search(self.predictor, self.joiner, enc_proj[index], lengths[greedy_rows],
                                            blank_id=self.blank_id, unk_id=self.unk_id,
                                            max_symbols=self.options.max_symbols)
            for i, hyp in zip(greedy_rows, hyps, strict=True):
                results[i] = hyp
        groups: dict[tuple, list[int]] = {}
        for i, o in enumerate(options_list):
            if self._beam(o):
                groups.setdefault((self._beam_size(o), o.n_best, o.hotwords), []).append(i)
        for (beam, n_best, hotwords), rows in groups.items():
            index = torch.tensor(rows, dtype=torch.long, device=enc_proj.device)
            if self._tdt():
                nbests = tdt_beam_search(self.predictor, self.joiner, enc_proj[index], lengths[rows],
                                         blank_id=self.blank_id, beam_size=beam, n_best=n_best,
                                         search=self.tdt_search)
            else:
                context = self.context_graph(hotwords) if hotwords else None
                nbests = transducer_modified_beam_search(self.predictor, self.joiner, enc_proj[index],
                                                         lengths[rows], blank_id=self.blank_id, unk_id=self.unk_id,
                                                         beam_size=beam, n_best=n_best, context=context)
            for i, nbest in zip(rows, nbests, strict=True):
                results[i] = with_nbest(nbest)
        frame = self.frame_seconds()
        for hyp, opts in zip(results, options_list, strict=True):
            self.finish_hypothesis(hyp, frame, opts)
        return results

    def finish_hypothesis(self, hyp: Hypothesis, frame: float, options) -> None:
        """Token times, the utterance confidence (geometric mean) and, when asked, word timings."""
        from oasr.decoding.words import finish_frame_hypothesis

        finish_frame_hypothesis(hyp, frame, self.ctx.tokenizer, word_timestamps=options.word_timestamps)

    # -- streaming ------------------------------------------------------------------------------------
    def stream_search(self, options) -> TransducerStreamSearch:
        return TransducerStreamSearch(self, options)

    def advance_streams(self, searches, hidden, lengths) -> None:
        """Project the chunk (B, T, D) once, then each stream's search takes its row's frames."""
        enc_proj = self.joiner.project_encoder(hidden)
        for row, search in enumerate(searches):
            if lengths[row]:
                search.advance_projected(enc_proj[row, : lengths[row]])


def with_nbest(nbest: list[Hypothesis]) -> Hypothesis:
    """The best of an n-best list, carrying the list."""
    best = nbest[0] if nbest else Hypothesis(tokens=[], token_frames=[], token_confidences=[])
    best.nbest = nbest
    return best


class TransducerStreamSearch:
    """One stream's greedy or beam search, fed projected frames chunk by chunk; its result after
    the last chunk equals the offline search of the concatenated frames."""

    keeps_hidden = False

    def __init__(self, strategy: TransducerDecodeStrategy, options):
        from oasr.decoding.tdt_beam import TdtBeamRows
        from oasr.decoding.tdt_search import tdt_beam_rows
        from oasr.decoding.transducer import BeamRows, GreedyRows

        self.strategy = strategy
        self.options = options
        device = strategy.ctx.device
        if strategy._beam(options) and strategy._tdt():
            self.beam: BeamRows | TdtBeamRows | None = tdt_beam_rows(
                strategy.predictor, strategy.joiner, 1, device, blank_id=strategy.blank_id,
                beam_size=strategy._beam_size(options), search=strategy.tdt_search)
            self.greedy = None
        elif strategy._beam(options):
            context = strategy.context_graph(options.hotwords) if options.hotwords else None
            self.beam = BeamRows(strategy.predictor, strategy.joiner, 1, device,
                                                  blank_id=strategy.blank_id, unk_id=strategy.unk_id,
                                                  beam_size=strategy._beam_size(options), context=context)
            self.greedy = None
        else:
            self.beam = None
            self.greedy = GreedyRows(strategy.predictor, strategy.joiner, 1, device, blank_id=strategy.blank_id,
                                     unk_id=strategy.unk_id, max_symbols=strategy.options.max_symbols)

    def advance(self, hidden: torch.Tensor) -> None:
        """One chunk's encoder frames (T, D) of this stream."""
        self.advance_projected(self.strategy.joiner.project_encoder(hidden))

    def advance_projected(self, enc_proj: torch.Tensor) -> None:
        """One chunk's projected encoder frames (T, J) of this stream."""
        if self.greedy is not None:
            self.greedy.run(enc_proj[None], [enc_proj.shape[0]])
            return
        for t in range(enc_proj.shape[0]):
            self.beam.step(enc_proj[t:t + 1], [0])

    def best(self) -> Hypothesis:
        if self.greedy is not None:
            return self.greedy.hypothesis(0)
        return self.beam.results(0, 1)[0]

    def final(self, hidden: list[torch.Tensor], frame_seconds: float) -> Hypothesis:
        if self.greedy is not None:
            hyp = self.greedy.hypothesis(0)
        else:
            hyp = with_nbest(self.beam.results(0, self.options.n_best))
        self.strategy.finish_hypothesis(hyp, frame_seconds, self.options)
        return hyp
