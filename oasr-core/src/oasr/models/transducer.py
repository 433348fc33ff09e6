"""The transducer model contract: a predictor (label history -> vector) and a joiner (frame x label -> logits).

A transducer model (a :class:`~oasr.models.base.BaseAsrModel`) exposes ``encode_offline`` (hidden
states and lengths), ``predictor`` (a :class:`TransducerPredictor`) and ``joiner`` (a
:class:`TransducerJoiner`); the core ``transducer`` decode strategy runs every search over these
two members, so one search serves a stateless label-window predictor (icefall) and a recurrent one
(NeMo's LSTM).

The predictor state is opaque to the search.  It only ever passes states back to the predictor:
``advance`` after an emission, ``select`` to reorder or repeat rows (beam expansion), and
``stack_states`` / ``unstack_states`` to move single streams in and out of a batch.  A state whose
rows are the last ``context`` labels (``label_window_state`` True) can be recomputed from a
hypothesis' labels, which modified beam search relies on; a recurrent state cannot, and the
strategy refuses ``beam_size > 1`` for it.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

__all__ = ["TransducerJoiner", "TransducerPredictor"]


@runtime_checkable
class TransducerPredictor(Protocol):
    """The prediction network as the transducer searches drive it, one batch of rows at a time."""

    #: the blank label (never emitted; the start state's last label in icefall's window)
    blank_id: int
    #: True when the state is a window of the last labels (a (B, context) int64 tensor or any
    #: tensor-only structure whose rows ``index_select`` cleanly): modified beam search is allowed.
    #: False for a recurrent state (NeMo's LSTM): the strategy refuses ``beam_size > 1``.
    label_window_state: bool

    def init_state(self, batch_size: int, device: torch.device) -> Any:
        """The state of ``batch_size`` rows before the first label (icefall: the window
        ``[-1] * (context - 1) + [blank]``; NeMo: the LSTM run once on the blank/zero embedding from a
        zero hidden state)."""
        ...

    def predict(self, state: Any) -> torch.Tensor:
        """(B, D_pred): the output each row's state feeds the joiner (before the joiner's own
        predictor projection)."""
        ...

    def advance(self, state: Any, tokens: torch.Tensor, emit: torch.Tensor) -> Any:
        """The state after the rows with ``emit[b]`` True took label ``tokens[b]`` ((B,) int64; ``emit``
        (B,) bool); the other rows are unchanged."""
        ...

    def select(self, state: Any, index: torch.Tensor) -> Any:
        """The rows picked by ``index`` ((N,) int64, repeats allowed): an ``index_select`` of every row."""
        ...

    def stack_states(self, states: list[Any]) -> Any:
        """One batch state from single-row states, in order."""
        ...

    def unstack_states(self, state: Any) -> list[Any]:
        """The single-row states of a batch state (the inverse of :meth:`stack_states`)."""
        ...


@runtime_checkable
class TransducerJoiner(Protocol):
    """The joint network, split so each encoder frame is projected once however many labels it meets."""

    #: () for RNN-T.  TDT: the duration values (e.g. ``(0, 1, 2, 3, 4)``); the joint's last
    #: ``len(durations)`` logits are then duration logits, the first ``vocab_size`` the token logits.
    durations: tuple[int, ...]

    def project_encoder(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., D) encoder hidden states -> (..., J); done once per frame."""
        ...

    def project_predictor(self, pred: torch.Tensor) -> torch.Tensor:
        """(..., D_pred) predictor outputs -> (..., J)."""
        ...

    def joint(self, enc_proj: torch.Tensor, pred_proj: torch.Tensor) -> torch.Tensor:
        """Unnormalized logits (..., V [+ len(durations)]) of broadcastable projected inputs
        (icefall: ``output_linear(tanh(e + p))``; NeMo: ``joint_net(relu(e + p))``)."""
        ...
