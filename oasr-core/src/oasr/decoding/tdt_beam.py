"""Beam search over a TDT joint's token and duration logits: NeMo's ``BeamTDTInfer`` with
``search_type="default"`` (``nemo/collections/asr/parts/submodules/tdt_beam_decoding.py``), the search
NeMo runs for ``decoding.strategy="beam"`` on a TDT model.

A hypothesis is a label sequence, a score and the frame it waits for (``last_frame``).  Frames are
visited in order; at frame ``t`` the hypotheses waiting for ``t`` are expanded best first, one at a
time, each by one joint of frame ``t`` and its predictor output:

- labels: the ``beam_k`` best non-blank token log-probabilities and the ``min(beam, D)`` best duration
  log-probabilities are paired, and the ``beam_k`` best pairs (by the sum) each make a hypothesis
  with one more label, moved ``duration`` frames on; a duration of 0 keeps it at frame ``t``, among the
  hypotheses still to expand there;
- blank: one hypothesis per duration of the best ``min(beam, D)`` (no label), moved that many frames;
  the zero duration is skipped, unless it is the only one considered, then the smallest non-zero
  duration stands in for it.

After every expansion the hypotheses waiting for later frames are merged by (labels, frame) with
``logaddexp`` (in order of score, the first keeps its place); then, while some hypotheses still wait
at ``t``, the expansion of frame ``t`` stops as soon as at least ``beam`` later-frame hypotheses score
above the best of those (all of them are kept, the rest at ``t`` are dropped); once none wait at
``t``, the later-frame hypotheses are cut to the ``beam`` best.  ``beam = min(beam_size, V - 1)`` and
``beam_k = min(beam, V - 2)`` for ``V`` token logits (blank included), as NeMo counts its vocabulary
without the blank.  Scores are float32 sums of log-probabilities as NeMo's tensors compute them (a
label adds token + duration log-probability, a blank adds blank + duration); the n-best is every kept
hypothesis ranked by score divided by the number of labels plus one (NeMo's ``score_norm``: its
sequences start with the blank).  ``token_frames`` are the frames the labels were emitted at.

A predictor output is computed once per label sequence (NeMo's hypothesis cache) from the state of
the sequence without its last label, so any predictor state serves, recurrent ones included.  The
rows of a batch are independent; the expansions of all rows that have one pending run in one
predictor call and one joint call.  :class:`TdtBeamRows` consumes frames one at a time, so a stream
fed chunk by chunk gives the offline result.  NeMo's other frame-synchronous TDT search, mAES
(``search_type="maes"``), is :mod:`oasr.decoding.tdt_maes`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from oasr.decoding.types import Hypothesis
from oasr.errors import ConfigError

__all__ = ["TdtBeamRows"]


class _Hyp:
    __slots__ = ("frames", "last_frame", "log_probs", "outs", "score", "tokens")

    def __init__(self, tokens: tuple, score: np.float32 | float, last_frame: int, frames: tuple, log_probs: tuple,
                 outs: tuple = ()):
        #: (mAES only) the projected predictor outputs after each prefix of ``tokens``, the last one current
        self.outs = outs
        self.tokens = tokens
        self.score = score
        self.last_frame = last_frame
        self.frames = frames
        self.log_probs = log_probs


def _merge(hyps: list[_Hyp]) -> list[_Hyp]:
    """NeMo's ``merge_duplicate_hypotheses``: by (labels, frame), best first, scores ``logaddexp``-ed in float32
    (a score keeps its type: NeMo's default search adds in float32, its mAES in float64)."""
    kept: dict[tuple, _Hyp] = {}
    for hyp in sorted(hyps, key=lambda h: h.score, reverse=True):
        key = (hyp.tokens, hyp.last_frame)
        old = kept.get(key)
        if old is None:
            kept[key] = hyp
        else:
            merged = torch.logaddexp(torch.tensor(float(old.score)), torch.tensor(float(hyp.score)))
            old.score = type(old.score)(merged.item())
    return list(kept.values())


class TdtBeamRows:
    """TDT beam search state of ``batch`` rows; :meth:`step` consumes one frame of some rows."""

    def __init__(self, predictor: Any, joiner: Any, batch: int, device: torch.device | str, *, blank_id: int,
                 beam_size: int = 4):
        durations = tuple(int(d) for d in (getattr(joiner, "durations", ()) or ()))
        if not durations:
            raise ConfigError("TDT beam search needs a joint with duration logits (joiner.durations is empty)",
                              key="beam_size")
        if int(beam_size) < 1:
            raise ConfigError(f"beam_size must be at least 1, got {beam_size}", key="beam_size")
        nonzero = [i for i, d in enumerate(durations) if d != 0]
        if not nonzero:
            raise ConfigError(f"TDT durations {durations} have no non-zero duration: a blank could never move on",
                              key="durations")
        self.predictor = predictor
        self.joiner = joiner
        self.device = torch.device(device)
        self.blank = int(blank_id)
        self.beam_size = int(beam_size)
        self.durations = durations
        self.zero_index = durations.index(0) if 0 in durations else None
        self.min_nonzero_index = min(nonzero, key=lambda i: durations[i])
        self.kept: list[list[_Hyp]] = [[_Hyp((), np.float32(0.0), 0, (), ())] for _ in range(batch)]
        state = predictor.init_state(batch, self.device)
        pred_proj = joiner.project_predictor(predictor.predict(state))
        #: per row: label sequence -> (single-row predictor state after it, its projected output)
        self.cache: list[dict[tuple, tuple[Any, torch.Tensor]]] = [
            {(): (single, pred_proj[b])} for b, single in enumerate(predictor.unstack_states(state))]
        #: per row: frames consumed so far (the global index of its next frame)
        self.frames_seen = [0] * batch
        self._labels: torch.Tensor | None = None

    def _sizes(self, vocab: int) -> tuple[int, int, int]:
        if self._labels is None:
            if not 0 <= self.blank < vocab or vocab < 3:
                raise ConfigError(f"TDT beam search needs a blank id in [0, {vocab}) and at least 2 labels; "
                                  f"got blank {self.blank} of {vocab} token logits", key="blank_id")
            self._labels = torch.tensor([i for i in range(vocab) if i != self.blank], dtype=torch.long)
        beam = min(self.beam_size, vocab - 1)
        return beam, min(beam, vocab - 2), min(beam, len(self.durations))

    def step(self, enc_t: torch.Tensor, rows: Sequence[int]) -> None:
        """One frame for ``rows`` (their projected frames ``enc_t`` (len(rows), J)); other rows are kept."""
        pending: dict[int, list[_Hyp]] = {}
        for i, row in enumerate(rows):
            t = self.frames_seen[row]
            waiting = [h for h in self.kept[row] if h.last_frame == t]
            self.kept[row] = [h for h in self.kept[row] if h.last_frame > t]
            if waiting:
                pending[i] = waiting
        while pending:
            order = sorted(pending)
            best = []
            for i in order:
                hyps = pending[i]
                top = max(range(len(hyps)), key=lambda k: hyps[k].score)  # the first best, as max() picks
                best.append(hyps.pop(top))
            pred_proj = self._predictor_outputs([rows[i] for i in order], best)
            index = torch.tensor(order, dtype=torch.long, device=enc_t.device)
            logits = self.joiner.joint(enc_t[index], pred_proj.to(enc_t.device)).float().cpu()
            for i, hyp, row_logits in zip(order, best, logits, strict=True):
                if self._expand(rows[i], hyp, row_logits, pending[i]):
                    del pending[i]
        for row in rows:
            self.frames_seen[row] += 1
            self._prune_cache(row)

    def _predictor_outputs(self, rows: list[int], hyps: list[_Hyp]) -> torch.Tensor:
        """(N, J): each hypothesis' projected predictor output, computed once per label sequence."""
        missing = [n for n, (row, hyp) in enumerate(zip(rows, hyps, strict=True)) if hyp.tokens not in self.cache[row]]
        if missing:
            parents = [self.cache[rows[n]][hyps[n].tokens[:-1]][0] for n in missing]
            state = self.predictor.stack_states(parents)
            tokens = torch.tensor([hyps[n].tokens[-1] for n in missing], dtype=torch.long, device=self.device)
            state = self.predictor.advance(state, tokens, torch.ones_like(tokens, dtype=torch.bool))
            fresh = self.joiner.project_predictor(self.predictor.predict(state))
            for n, single, out in zip(missing, self.predictor.unstack_states(state), fresh, strict=True):
                self.cache[rows[n]][hyps[n].tokens] = (single, out)
        return torch.stack([self.cache[row][hyp.tokens][1] for row, hyp in zip(rows, hyps, strict=True)])

    def _expand(self, row: int, hyp: _Hyp, logits: torch.Tensor, waiting: list[_Hyp]) -> bool:
        """Expand ``hyp`` at its frame by one joint's ``logits``; True when the row's frame is done."""
        vocab = logits.shape[-1] - len(self.durations)
        beam, beam_k, dur_k = self._sizes(vocab)
        log_probs = logits[:vocab].log_softmax(-1)
        dur_log_probs = logits[vocab:].log_softmax(-1)
        label_values, label_pos = log_probs[self._labels].topk(beam_k)
        dur_values, dur_index = dur_log_probs.topk(dur_k)
        pair_values, pair_pos = (dur_values[:, None] + label_values[None, :]).reshape(-1).topk(beam_k)
        t = hyp.last_frame
        labels = self._labels[label_pos].tolist()
        dur_index = dur_index.tolist()
        lp = log_probs.tolist()
        kept = self.kept[row]
        for value, pos in zip(pair_values.tolist(), pair_pos.tolist(), strict=True):
            token, duration = labels[pos % beam_k], self.durations[dur_index[pos // beam_k]]
            new = _Hyp(hyp.tokens + (token,), np.float32(hyp.score + np.float32(value)), t + duration,
                       hyp.frames + (t,), hyp.log_probs + (lp[token],))
            (waiting if duration == 0 else kept).append(new)
        blank_lp = np.float32(lp[self.blank])
        dur_lp = dur_log_probs.tolist()
        for d in dur_index:
            if d == self.zero_index:
                if dur_k > 1:
                    continue
                d = self.min_nonzero_index
            score = np.float32(np.float32(hyp.score + blank_lp) + np.float32(dur_lp[d]))
            kept.append(_Hyp(hyp.tokens, score, t + self.durations[d], hyp.frames, hyp.log_probs))
        kept = _merge(kept)
        if waiting:
            bar = max(h.score for h in waiting)
            above = sorted((h for h in kept if h.score > bar), key=lambda h: h.score)
            self.kept[row] = above if len(above) >= beam else kept
            return len(above) >= beam
        self.kept[row] = sorted(kept, key=lambda h: h.score, reverse=True)[:beam]
        return True

    def _prune_cache(self, row: int) -> None:
        """Keep the predictor outputs the row's hypotheses can still ask for (theirs and their parents')."""
        keys = {()}
        for hyp in self.kept[row]:
            keys.add(hyp.tokens)
            keys.add(hyp.tokens[:-1])
        cache = self.cache[row]
        for key in [k for k in cache if k not in keys]:
            del cache[key]

    def results(self, row: int, n_best: int | None = None) -> list[Hypothesis]:
        """The row's ``n_best`` (default: all kept) hypotheses, best first; the state is not changed."""
        ranked = sorted(self.kept[row], key=lambda h: float(h.score) / (len(h.tokens) + 1), reverse=True)
        return [Hypothesis(tokens=list(h.tokens), score=float(h.score), token_frames=list(h.frames),
                           token_confidences=[math.exp(x) for x in h.log_probs])
                for h in ranked[:n_best or len(ranked)]]
