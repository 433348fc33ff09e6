"""Transducer searches over a :class:`~oasr.models.transducer.TransducerPredictor` and a
:class:`~oasr.models.transducer.TransducerJoiner`: greedy (with TDT durations) and modified beam search.

Every search takes the *projected* encoder frames (``joiner.project_encoder(hidden)``, done once per
frame by the caller) and keeps its rows' predictor states opaque: it only hands them back to the
predictor (``advance``, ``select``).  Logits are read in float32; log-probabilities are
``log_softmax`` of the token logits (the first ``V`` of the joint's output; a TDT joint's last
``len(joiner.durations)`` logits are duration logits).

Greedy (:func:`transducer_greedy_search`, :class:`GreedyRows`)
    icefall's ``greedy_search`` per row (``egs/librispeech/ASR/zipformer/beam_search.py``): at frame
    ``t`` the argmax of the raw token logits; blank or ``unk_id`` moves to ``t + 1``; another label is
    emitted at ``t``, advances the predictor and is followed by another joint at the same frame, at
    most ``max_symbols`` labels per frame (then the search moves on).  With ``max_symbols=1`` this is
    ``greedy_search_batch``.  Rows are independent: each keeps its own frame index and stops at its
    own length.  With TDT durations the search is NeMo's label-looping TDT greedy: the frame advances
    by the argmax duration after every decision (a blank's duration 0 counts as 1; ``max_symbols``
    labels at one frame force a step of 1).  ``score`` is the sum of the chosen symbols' token
    log-probabilities (blanks included); ``token_confidences`` the emitted tokens' probabilities.

Modified beam search (:func:`transducer_modified_beam_search`, :class:`BeamRows`)
    icefall's ``modified_beam_search``: one symbol per frame; per row the ``beam_size`` best of
    (hypotheses x vocabulary) by accumulated log-probability (ties: the lower flat index, i.e. the
    earlier hypothesis, then the lower token id); candidates with the same label sequence merged by
    ``logaddexp`` (the first, higher one keeps its frames); blank and ``unk_id`` extend a hypothesis
    without a label.  With a :class:`~oasr.decoding.context.ContextGraph` an emitted token adds its
    context score to the hypothesis' score and the partial match is given back at the end.  The
    n-best is ranked as icefall's ``get_most_probable(length_norm=True)``: score divided by the
    number of labels plus the predictor's start window (``predictor.context_size`` when it has one,
    else the width of a 2-D label-window state, else 1).  ``score`` is the accumulated (merged)
    log-probability plus context bonus; ``token_confidences`` the emitted tokens' probabilities on
    the kept alignment.

Both are classes that advance a group of rows over frames, so a stream's search (the same class over
one row, fed chunk by chunk) gives the offline result.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from oasr.decoding.context import ROOT, ContextGraph
from oasr.decoding.ctc import topk_labels
from oasr.decoding.types import Hypothesis
from oasr.errors import ConfigError

__all__ = ["BeamRows", "GreedyRows", "label_window_width", "transducer_greedy_search",
           "transducer_modified_beam_search"]


def _row_lengths(lengths: torch.Tensor | Sequence[int], batch: int, frames: int) -> list[int]:
    out = [int(x) for x in (lengths.tolist() if isinstance(lengths, torch.Tensor) else lengths)]
    if len(out) != batch:
        raise ConfigError(f"{len(out)} lengths for a batch of {batch} rows", key="lengths")
    if out and (min(out) < 0 or max(out) > frames):
        raise ConfigError(f"lengths must lie in [0, {frames}] (the frame axis), got {out}", key="lengths")
    return out


def _check_enc(enc_proj: torch.Tensor) -> None:
    if not isinstance(enc_proj, torch.Tensor) or enc_proj.dim() != 3:
        raise ConfigError("projected encoder frames must be a (B, T, J) tensor, got "
                          f"{getattr(enc_proj, 'shape', type(enc_proj))}", key="enc_proj")


def label_window_width(predictor: Any, state: Any) -> int:
    """The number of start-window labels icefall's length normalization counts (see module docstring)."""
    width = getattr(predictor, "context_size", None)
    if width is not None:
        return int(width)
    if isinstance(state, torch.Tensor) and state.dim() == 2:
        return int(state.shape[1])
    return 1


# -- greedy -------------------------------------------------------------------------------------------
def _host_picks(logits: np.ndarray, vocab: int, durations: bool) -> list[list]:
    """Per row of CPU logits (rows, vocab [+ durations]), read in numpy (a few array ops, no torch dispatch per
    decision): the argmax label of the token logits, its log-probability ``-log(sum(exp(x - max)))`` (the
    log-softmax at the argmax) and, with ``durations``, the argmax duration index."""
    tokens = logits[:, :vocab]
    top = tokens.max(1, keepdims=True)
    picks = [tokens.argmax(1).tolist(), (-np.log(np.exp(tokens - top).sum(1))).tolist()]
    if durations:
        picks.append(logits[:, vocab:].argmax(1).tolist())
    return picks


class GreedyRows:
    """Greedy search state of ``batch`` rows; :meth:`run` consumes frames, :meth:`hypothesis` reads a row.

    Each decision is one joint over the rows still active (in row order) and one host transfer of
    their labels, duration indices and log-probabilities (CPU logits are read in numpy, see
    :func:`_host_picks`); the per-row frame indices, symbol counts and results are plain Python numbers,
    so a decision allocates no bookkeeping tensors.
    """

    def __init__(self, predictor: Any, joiner: Any, batch: int, device: torch.device | str, *, blank_id: int,
                 unk_id: int | None = None, max_symbols: int = 1):
        if int(max_symbols) < 1:
            raise ConfigError(f"max_symbols (labels per frame) must be at least 1, got {max_symbols}",
                              key="max_symbols")
        self.predictor = predictor
        self.joiner = joiner
        self.device = torch.device(device)
        self.blank = int(blank_id)
        self.unk = self.blank if unk_id is None else int(unk_id)
        self.max_symbols = int(max_symbols)
        self.durations = tuple(int(d) for d in getattr(joiner, "durations", ()) or ())
        self.state = predictor.init_state(batch, self.device)
        #: (batch, J) the projected predictor output of every row; written in place after emissions
        self.pred_proj = joiner.project_predictor(predictor.predict(self.state)).clone()
        #: per row: the next frame to read, relative to the frames of the next ``run``
        self.time = [0] * batch
        #: per row: labels emitted at its current frame
        self.symbols = [0] * batch
        #: per row: global index of the first frame of the next ``run``
        self.offset = [0] * batch
        self.tokens: list[list[int]] = [[] for _ in range(batch)]
        self.frames: list[list[int]] = [[] for _ in range(batch)]
        self.token_log_probs: list[list[float]] = [[] for _ in range(batch)]
        self.scores = [0.0] * batch

    def run(self, enc_proj: torch.Tensor, lengths: torch.Tensor | Sequence[int]) -> None:
        """Consume row ``b``'s frames ``enc_proj[b, :lengths[b]]`` ((B, T, J), projected).  A TDT step
        past a row's last frame carries over into the next ``run``."""
        _check_enc(enc_proj)
        lens = _row_lengths(lengths, enc_proj.shape[0], enc_proj.shape[1])
        batch = len(self.time)
        every = torch.arange(batch, device=enc_proj.device)
        while True:
            active = [b for b in range(batch) if self.time[b] < lens[b]]
            if not active:
                break
            self._step(enc_proj, active, every if len(active) == batch else None)
        for b in range(batch):
            self.offset[b] += lens[b]
            self.time[b] -= lens[b]

    def _step(self, enc_proj: torch.Tensor, active: list[int], every: torch.Tensor | None) -> None:
        if every is not None and len(active) == 1:  # one row: a view of its frame
            enc, pred = enc_proj[:, self.time[0]], self.pred_proj
        elif every is not None:  # all rows: no row gather
            enc, pred = enc_proj[every, self._times(active, enc_proj.device)], self.pred_proj
        else:
            rows_enc = torch.tensor(active, dtype=torch.long, device=enc_proj.device)
            rows_dev = rows_enc if enc_proj.device == self.device else rows_enc.to(self.device)
            enc, pred = enc_proj[rows_enc, self._times(active, enc_proj.device)], self.pred_proj[rows_dev]
        logits = self.joiner.joint(enc, pred)
        vocab = logits.shape[-1] - len(self.durations)
        if logits.device.type == "cpu":
            host = _host_picks(logits.detach().float().numpy(), vocab, bool(self.durations))
        else:  # one transfer per decision; float64 holds the int ids and the float32 lps exactly
            logits = logits.float()
            token_logits = logits[:, :vocab]
            labels = token_logits.argmax(-1)
            picks = [labels, token_logits.log_softmax(-1).gather(-1, labels[:, None])[:, 0]]
            if self.durations:
                picks.append(logits[:, vocab:].argmax(-1))
            host = torch.stack([pick.double() for pick in picks]).cpu().tolist()
        emitted_rows: list[int] = []
        emitted_labels: list[int] = []
        for i, row in enumerate(active):
            label, lp = int(host[0][i]), host[1][i]
            emit = label != self.blank and label != self.unk
            step = self.durations[int(host[2][i])] if self.durations else int(not emit)
            if not emit and step == 0:
                step = 1
            symbols = self.symbols[row] + emit
            if emit and step == 0 and symbols >= self.max_symbols:
                step = 1
            self.scores[row] += lp
            if emit:
                self.tokens[row].append(label)
                self.frames[row].append(self.offset[row] + self.time[row])
                self.token_log_probs[row].append(lp)
                emitted_rows.append(row)
                emitted_labels.append(label)
            self.time[row] += step
            self.symbols[row] = 0 if step > 0 else symbols
        if emitted_rows:
            self._advance(emitted_rows, emitted_labels)

    def _times(self, active: list[int], device: torch.device) -> torch.Tensor:
        return torch.tensor([self.time[b] for b in active], dtype=torch.long, device=device)

    def _advance(self, rows: list[int], labels: list[int]) -> None:
        batch = len(self.time)
        tokens = [self.blank] * batch
        mask = [False] * batch
        for row, label in zip(rows, labels, strict=True):
            tokens[row] = label
            mask[row] = True
        self.state = self.predictor.advance(self.state, torch.tensor(tokens, dtype=torch.long, device=self.device),
                                            torch.tensor(mask, dtype=torch.bool, device=self.device))
        if len(rows) == batch:  # every row took a label: no row selection
            self.pred_proj = self.joiner.project_predictor(self.predictor.predict(self.state)).to(
                self.pred_proj.dtype).clone()
            return
        rows_dev = torch.tensor(rows, dtype=torch.long, device=self.device)
        fresh = self.joiner.project_predictor(self.predictor.predict(self.predictor.select(self.state, rows_dev)))
        self.pred_proj[rows_dev] = fresh.to(self.pred_proj.dtype)

    def hypothesis(self, row: int) -> Hypothesis:
        return Hypothesis(tokens=list(self.tokens[row]), score=float(self.scores[row]),
                          token_frames=list(self.frames[row]),
                          token_confidences=[math.exp(x) for x in self.token_log_probs[row]])


def transducer_greedy_search(predictor: Any, joiner: Any, enc_proj: torch.Tensor,
                             lengths: torch.Tensor | Sequence[int], *, blank_id: int, unk_id: int | None = None,
                             max_symbols: int = 1) -> list[Hypothesis]:
    """Greedy search of each row of the projected encoder frames ``enc_proj`` (B, T, J)."""
    _check_enc(enc_proj)
    rows = GreedyRows(predictor, joiner, enc_proj.shape[0], enc_proj.device, blank_id=blank_id, unk_id=unk_id,
                      max_symbols=max_symbols)
    rows.run(enc_proj, lengths)
    return [rows.hypothesis(b) for b in range(enc_proj.shape[0])]


# -- modified beam search -----------------------------------------------------------------------------
class _Hyp:
    __slots__ = ("context_state", "frames", "log_probs", "score", "tokens")

    def __init__(self, tokens: tuple, score: np.float32, frames: tuple, log_probs: tuple, context_state: int):
        self.tokens = tokens
        self.score = score
        self.frames = frames
        self.log_probs = log_probs
        self.context_state = context_state


class BeamRows:
    """Modified beam search state of ``batch`` rows; :meth:`step` consumes one frame of some rows."""

    def __init__(self, predictor: Any, joiner: Any, batch: int, device: torch.device | str, *, blank_id: int,
                 unk_id: int | None = None, beam_size: int = 4, context: ContextGraph | None = None):
        if int(beam_size) < 1:
            raise ConfigError(f"beam_size must be at least 1, got {beam_size}", key="beam_size")
        if not getattr(predictor, "label_window_state", False):
            raise ConfigError(f"modified beam search needs a label-window predictor state; "
                              f"{type(predictor).__name__} is recurrent (label_window_state is False)",
                              key="beam_size")
        if getattr(joiner, "durations", ()):
            raise ConfigError("modified beam search over TDT durations is not implemented; use greedy search",
                              key="beam_size")
        self.predictor = predictor
        self.joiner = joiner
        self.device = torch.device(device)
        self.blank = int(blank_id)
        self.unk = self.blank if unk_id is None else int(unk_id)
        self.beam = int(beam_size)
        self.context = context
        self.hyps: list[list[_Hyp]] = [[_Hyp((), np.float32(0.0), (), (), ROOT)] for _ in range(batch)]
        self.state = predictor.init_state(batch, self.device)
        self.window = label_window_width(predictor, self.state)
        self.pred_proj = joiner.project_predictor(predictor.predict(self.state))
        #: per row: frames consumed so far (the global index of its next frame)
        self.frames_seen = [0] * batch

    def step(self, enc_t: torch.Tensor, rows: Sequence[int]) -> None:
        """One frame for ``rows`` (their projected frames ``enc_t`` (len(rows), J)); other rows are kept."""
        rows = list(rows)
        if not rows:
            return
        counts = [len(h) for h in self.hyps]
        starts = np.concatenate(([0], np.cumsum(counts)))
        flat = [int(starts[r]) + k for r in rows for k in range(counts[r])]
        pos = [i for i, r in enumerate(rows) for _ in range(counts[r])]
        flat_dev = torch.tensor(flat, dtype=torch.long, device=self.device)
        enc = enc_t[torch.tensor(pos, dtype=torch.long, device=enc_t.device)]
        log_probs = self.joiner.joint(enc, self.pred_proj[flat_dev]).float().log_softmax(-1)
        vocab = log_probs.shape[-1]
        scores = torch.tensor([float(self.hyps[r][k].score) for r in rows for k in range(counts[r])],
                              dtype=torch.float32, device=log_probs.device)
        width = max(counts[r] for r in rows)
        padded = torch.full((len(rows), width, vocab), float("-inf"), dtype=torch.float32, device=log_probs.device)
        slot = torch.tensor([k for r in rows for k in range(counts[r])], dtype=torch.long, device=log_probs.device)
        padded[torch.tensor(pos, dtype=torch.long, device=log_probs.device), slot] = log_probs + scores[:, None]
        values, ids = topk_labels(padded.reshape(len(rows), width * vocab).cpu(), min(self.beam, width * vocab))
        offsets = np.concatenate(([0], np.cumsum([counts[r] for r in rows])))
        # (active row, hypothesis, token, accumulated score), best first per row; padding left out
        picks = [(i, k // vocab, k % vocab, v) for i in range(len(rows))
                 for k, v in zip(ids[i], values[i], strict=True) if k // vocab < counts[rows[i]]]
        pick_lp = log_probs[torch.tensor([int(offsets[i]) + h for i, h, _, _ in picks], dtype=torch.long,
                                         device=log_probs.device),
                            torch.tensor([t for _, _, t, _ in picks], dtype=torch.long, device=log_probs.device)]
        pick_lp = pick_lp.cpu().tolist()
        new_rows: dict[int, tuple[list[_Hyp], list[int], list[int]]] = {}
        for n, (i, h, token, value) in enumerate(picks):
            row = rows[i]
            hyp_list, parents, labels = new_rows.setdefault(row, ([], [], []))
            self._extend(hyp_list, parents, labels, self.hyps[row][h], int(starts[row]) + h, token,
                         np.float32(value), pick_lp[n], self.frames_seen[row])
        self._reorder(new_rows, counts, starts)
        for r in rows:
            self.frames_seen[r] += 1

    def _extend(self, hyp_list: list[_Hyp], parents: list[int], labels: list[int], hyp: _Hyp, parent: int,
                token: int, value: np.float32, lp: float, frame: int) -> None:
        if token in (self.blank, self.unk):
            new = _Hyp(hyp.tokens, value, hyp.frames, hyp.log_probs, hyp.context_state)
            label = -1
        else:
            state, bonus = hyp.context_state, 0.0
            if self.context is not None:
                bonus, state = self.context.step(hyp.context_state, token)
            new = _Hyp(hyp.tokens + (token,), np.float32(value + np.float32(bonus)), hyp.frames + (frame,),
                       hyp.log_probs + (lp,), state)
            label = token
        for old in hyp_list:
            if old.tokens == new.tokens:
                old.score = np.logaddexp(old.score, new.score)
                return
        hyp_list.append(new)
        parents.append(parent)
        labels.append(label)

    def _reorder(self, new_rows: dict, counts: list[int], starts: np.ndarray) -> None:
        parents: list[int] = []
        labels: list[int] = []
        for row in range(len(self.hyps)):
            if row in new_rows:
                hyp_list, row_parents, row_labels = new_rows[row]
                self.hyps[row] = hyp_list
                parents.extend(row_parents)
                labels.extend(row_labels)
            else:
                parents.extend(range(int(starts[row]), int(starts[row]) + counts[row]))
                labels.extend([-1] * counts[row])
        index = torch.tensor(parents, dtype=torch.long, device=self.device)
        tokens = torch.tensor(labels, dtype=torch.long)
        emit = tokens >= 0
        state = self.predictor.select(self.state, index)
        self.state = self.predictor.advance(state, torch.where(emit, tokens, self.blank).to(self.device),
                                            emit.to(self.device))
        pred_proj = self.pred_proj[index]
        if bool(emit.any()):
            rows = torch.nonzero(emit).flatten().to(self.device)
            fresh = self.joiner.project_predictor(self.predictor.predict(self.predictor.select(self.state, rows)))
            pred_proj[rows] = fresh.to(pred_proj.dtype)
        self.pred_proj = pred_proj

    def results(self, row: int, n_best: int | None = None) -> list[Hypothesis]:
        """The row's ``n_best`` (default: all) hypotheses, best first (the state itself is not changed)."""
        ranked = []
        for hyp in self.hyps[row]:
            score = float(hyp.score)
            if self.context is not None:
                score = float(np.float32(hyp.score + np.float32(self.context.finalize(hyp.context_state))))
            ranked.append((score / (len(hyp.tokens) + self.window), score, hyp))
        ranked.sort(key=lambda item: item[0], reverse=True)
        return [Hypothesis(tokens=list(hyp.tokens), score=score, token_frames=list(hyp.frames),
                           token_confidences=[math.exp(x) for x in hyp.log_probs])
                for _, score, hyp in ranked[:n_best or len(ranked)]]


def transducer_modified_beam_search(predictor: Any, joiner: Any, enc_proj: torch.Tensor,
                                    lengths: torch.Tensor | Sequence[int], *, blank_id: int,
                                    unk_id: int | None = None, beam_size: int = 4, n_best: int = 1,
                                    context: ContextGraph | None = None) -> list[list[Hypothesis]]:
    """Modified beam search of each row of ``enc_proj`` (B, T, J): the ``n_best`` best per row, best first."""
    _check_enc(enc_proj)
    if int(n_best) < 1 or int(n_best) > int(beam_size):
        raise ConfigError(f"n_best must lie in [1, beam_size={beam_size}], got {n_best}", key="n_best")
    lens = _row_lengths(lengths, enc_proj.shape[0], enc_proj.shape[1])
    rows = BeamRows(predictor, joiner, enc_proj.shape[0], enc_proj.device, blank_id=blank_id, unk_id=unk_id,
                    beam_size=beam_size, context=context)
    for t in range(max(lens, default=0)):
        active = [b for b, n in enumerate(lens) if n > t]
        rows.step(enc_proj[torch.tensor(active, dtype=torch.long, device=enc_proj.device), t], active)
    return [rows.results(b, n_best) for b in range(enc_proj.shape[0])]
