"""NeMo's modified adaptive expansion search (mAES) over a TDT joint: ``BeamTDTInfer`` with
``search_type="maes"`` (``nemo/collections/asr/parts/submodules/tdt_beam_decoding.py``).

Frame-synchronous as the default TDT search (:mod:`oasr.decoding.tdt_beam`: hypotheses wait for a
frame, are merged by (labels, frame) and cut to ``beam``), but each frame's hypotheses are expanded
together, in up to ``num_steps`` rounds:

- with a zero duration, a prefix search first: a hypothesis whose labels extend another's by at
  most ``prefix_alpha`` adds (``logaddexp``) the score of reaching it from that prefix at this frame
  with zero durations, scored with the predictor outputs the two hypotheses hold;
- a round scores ``beam_size + expansion_beta`` best tokens (blank included) against every
  duration and keeps the same number of best (token, duration) pairs per hypothesis, then those
  within ``expansion_gamma`` of the hypothesis' best pair; a blank with duration 0 moves by the
  smallest non-zero duration (its score keeps the zero duration's log-probability);
- blanks and labels with a non-zero duration wait for later frames; labels with duration 0 are
  expanded again in the next round; after the last round they add the blank's log-probability with
  their most probable duration (a zero one replaced by the smallest non-zero) and wait too.

Scores add in float64 as NeMo's Python floats do (merges in float32).  Each hypothesis keeps the
projected predictor outputs of all its prefixes (the prefix search reads them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from oasr.decoding.tdt_beam import TdtBeamRows, _Hyp, _merge
from oasr.errors import ConfigError

__all__ = ["TdtMaesRows"]


class TdtMaesRows(TdtBeamRows):
    """mAES state of ``batch`` rows; :meth:`step` consumes one frame of some rows (NeMo's defaults: 2 steps,
    prefix 1, beta 2, gamma 2.3)."""

    def __init__(self, predictor: Any, joiner: Any, batch: int, device: torch.device | str, *, blank_id: int,
                 beam_size: int = 4, num_steps: int = 2, prefix_alpha: int = 1, expansion_beta: int = 2,
                 expansion_gamma: float = 2.3):
        super().__init__(predictor, joiner, batch, device, blank_id=blank_id, beam_size=beam_size)
        if int(num_steps) < 1 or int(prefix_alpha) < 0 or int(expansion_beta) < 0:
            raise ConfigError(f"mAES needs num_steps >= 1, prefix_alpha >= 0 and expansion_beta >= 0, got "
                              f"{num_steps}, {prefix_alpha}, {expansion_beta}", key="maes")
        self.num_steps, self.prefix_alpha = int(num_steps), int(prefix_alpha)
        self.candidates = self.beam_size + int(expansion_beta)
        self.gamma = float(expansion_gamma)
        self.kept = [[_Hyp((), 0.0, 0, (), (), outs=(self.cache[b][()][1],))] for b in range(batch)]

    def step(self, enc_t: torch.Tensor, rows: Sequence[int]) -> None:
        for i, row in enumerate(rows):
            self._frame(row, enc_t[i])
            self.frames_seen[row] += 1
            self._prune_cache(row)

    def _scores(self, enc: torch.Tensor, outs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(token log-probs (H, V), duration log-probs (H, D)) of one frame against predictor outputs."""
        pred = torch.stack(outs).to(enc.device)
        logits = self.joiner.joint(enc[None].expand(pred.shape[0], -1), pred).float().cpu()
        vocab = logits.shape[-1] - len(self.durations)
        if self.candidates > vocab:
            raise ConfigError(f"mAES needs beam_size + expansion_beta = {self.candidates} <= the {vocab} token "
                              f"logits", key="beam_size")
        self._sizes(vocab)
        return logits[:, :vocab].log_softmax(-1), logits[:, vocab:].log_softmax(-1)

    def _with_outputs(self, row: int, hyps: list[_Hyp]) -> None:
        if hyps:
            fresh = self._predictor_outputs([row] * len(hyps), hyps)
            for hyp, out in zip(hyps, fresh, strict=True):
                hyp.outs = hyp.outs + (out,)

    def _frame(self, row: int, enc: torch.Tensor) -> None:
        t = self.frames_seen[row]
        hyps = [h for h in self.kept[row] if h.last_frame == t]
        kept = [h for h in self.kept[row] if h.last_frame > t]
        if not hyps:
            self.kept[row] = kept
            return
        if self.zero_index is not None:
            hyps = self._prefix_search(sorted(hyps, key=lambda h: len(h.tokens), reverse=True), enc)
        blanks, later = [], []
        for n in range(self.num_steps):
            log_probs, dur_log_probs = self._scores(enc, [h.outs[-1] for h in hyps])
            beam = min(self.beam_size, log_probs.shape[-1] - 1)
            top_values, top_ids = log_probs.topk(self.candidates, dim=-1)
            totals = (dur_log_probs[:, :, None] + top_values[:, None, :]).reshape(len(hyps), -1)
            pair_values, pair_pos = totals.topk(self.candidates, dim=-1)
            keep = pair_values >= pair_values.max(-1, keepdim=True).values - self.gamma
            again, moved = [], []
            for h, hyp in enumerate(hyps):
                for pos in pair_pos[h][keep[h]].tolist():
                    token = int(top_ids[h, pos % self.candidates])
                    d_index = pos // self.candidates
                    duration = self.durations[d_index]
                    if token == self.blank and duration == 0:
                        duration = self.durations[self.min_nonzero_index]
                    score = hyp.score + float(totals[h, pos])
                    if token == self.blank:
                        blanks.append(_Hyp(hyp.tokens, score, hyp.last_frame + duration, hyp.frames,
                                           hyp.log_probs, hyp.outs))
                        continue
                    new = _Hyp(hyp.tokens + (token,), score, hyp.last_frame + duration, hyp.frames + (t,),
                               hyp.log_probs + (float(log_probs[h, token]),), hyp.outs)
                    (again if duration == 0 else moved).append(new)
            self._with_outputs(row, moved + again)
            later += moved
            if not again:
                self.kept[row] = sorted(_merge(kept + blanks + later), key=lambda x: x.score, reverse=True)[:beam]
                return
            if n < self.num_steps - 1:
                hyps = _merge(again)
                continue
            log_probs, dur_log_probs = self._scores(enc, [h.outs[-1] for h in again])
            best = dur_log_probs.argmax(-1).tolist()
            for h, hyp in enumerate(again):
                d = self.min_nonzero_index if best[h] == self.zero_index else best[h]
                hyp.score += float(log_probs[h, self.blank] + dur_log_probs[h, d])
                hyp.last_frame += self.durations[d]
            self.kept[row] = sorted(_merge(kept + blanks + again + later), key=lambda x: x.score,
                                    reverse=True)[:beam]

    def _prefix_search(self, hyps: list[_Hyp], enc: torch.Tensor) -> list[_Hyp]:
        """NeMo's ``prefix_search`` over hypotheses sorted longest first; scores updated in place."""
        for i, curr in enumerate(hyps[:-1]):
            for pref in hyps[i + 1:]:
                short = len(pref.tokens)
                if not (short < len(curr.tokens) and curr.tokens[:short] == pref.tokens
                        and len(curr.tokens) - short <= self.prefix_alpha):
                    continue
                log_probs, dur_log_probs = self._scores(enc, [pref.outs[-1]])
                score = pref.score + float(log_probs[0, curr.tokens[short]] + dur_log_probs[0, self.zero_index])
                for k in range(short + 1, len(curr.tokens)):
                    log_probs, dur_log_probs = self._scores(enc, [curr.outs[k]])
                    score += float(log_probs[0, curr.tokens[k]] + dur_log_probs[0, self.zero_index])
                curr.score = float(np.logaddexp(curr.score, score))
        return hyps
