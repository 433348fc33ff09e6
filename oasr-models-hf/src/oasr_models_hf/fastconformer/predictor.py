"""NeMo's RNN-T / TDT prediction and joint networks (transformers' ``ParakeetRNNTDecoder`` and
``ParakeetRNNTJointNetwork``) behind the core transducer contract (:mod:`oasr.models.transducer`).

- :class:`LstmPredictor` (``decoder.embedding``, ``decoder.lstm``): a label's embedding through a stacked
  LSTM.  Its state is recurrent — ``(output (B, D), h (L, B, D), c (L, B, D))`` — so
  ``label_window_state`` is False and the core refuses beam search for it.  The start state is the LSTM
  run once on the blank's embedding from zero (h, c), as transformers' ``generate()`` starts from
  ``decoder_start_token_id = blank`` (NeMo's blank embedding is its zero padding row: the same thing on a
  trained checkpoint).
- :class:`AdditiveJoint` (``joint.*``): ``head(act(encoder_projector(h) + decoder_projector(p)))``; the two
  projections are applied once per frame and once per predictor state.  A TDT joint's ``head`` has
  ``len(durations)`` extra outputs, the duration logits.

Two model mixins put these heads (or a CTC head) on an encoder: :class:`LstmTransducerHeads` (the
``transducer`` capability) and :class:`CtcHead` (the ``ctc`` capability).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from oasr.layers import LSTM, CtcProjection, Embedding, Linear, activation_fn
from oasr.layers.derived import row_major
from oasr_models_hf.fastconformer.config import ParakeetRnntConfig

State = tuple[torch.Tensor, torch.Tensor, torch.Tensor]

#: at most this many rows take :func:`few_row_linear`'s row-major weight copy (a greedy search's rows)
FEW_ROWS = 16


def few_row_linear(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` for a float32 :class:`~oasr.layers.Linear` on CPU inference at a few rows, as one
    ``addmm`` over a row-major (in, out) copy of the weight: at one row right after a predictor step (cold
    caches) the 640 → 1030 TDT head runs ~0.25 ms instead of F.linear's ~0.35 ms (``benchmarks/tdt_search.py``).
    The copy is derived data (:func:`oasr.layers.derived.row_major`); anything else takes the module."""
    weight = module.weight
    if (x.device.type != "cpu" or x.dtype != torch.float32 or weight.dtype != torch.float32 or x.dim() != 2
            or x.shape[0] > FEW_ROWS or torch.is_grad_enabled() or getattr(module, "_int8", None) is not None):
        return module(x)
    weight_t, bias = row_major(module, weight), module.bias
    return x @ weight_t if bias is None else torch.addmm(bias, x, weight_t)


class LstmPredictor(nn.Module):
    """The prediction network: label → embedding → stacked LSTM (a :class:`~oasr.models.transducer.TransducerPredictor`)."""

    label_window_state = False

    def __init__(self, config: ParakeetRnntConfig):
        super().__init__()
        self.blank_id = config.blank_id
        self.embedding = Embedding(config.vocab_size, config.decoder_hidden_size)
        self.lstm = LSTM(config.decoder_hidden_size, config.decoder_hidden_size, config.num_decoder_layers)

    def _run(self, tokens: torch.Tensor, hc: tuple[torch.Tensor, torch.Tensor] | None) -> State:
        out, (h, c) = self.lstm.embedded_step(tokens, self.embedding, hc)
        return out, h, c

    def init_state(self, batch_size: int, device: torch.device) -> State:
        blank = torch.full((batch_size,), self.blank_id, dtype=torch.long, device=device)
        return self._run(blank, None)

    def predict(self, state: State) -> torch.Tensor:
        return state[0]

    def advance(self, state: State, tokens: torch.Tensor, emit: torch.Tensor) -> State:
        rows = torch.nonzero(emit).flatten()
        if rows.numel() == 0:
            return state
        out, h, c = state
        if rows.numel() == emit.numel():
            return self._run(tokens, (h, c))
        new_out, new_h, new_c = self._run(tokens[rows], (h[:, rows], c[:, rows]))
        out, h, c = out.clone(), h.clone(), c.clone()
        out[rows], h[:, rows], c[:, rows] = new_out, new_h, new_c
        return out, h, c

    def select(self, state: State, index: torch.Tensor) -> State:
        out, h, c = state
        return out.index_select(0, index), h.index_select(1, index), c.index_select(1, index)

    def stack_states(self, states: list[State]) -> State:
        return (torch.cat([s[0] for s in states], 0), torch.cat([s[1] for s in states], 1),
                torch.cat([s[2] for s in states], 1))

    def unstack_states(self, state: State) -> list[State]:
        out, h, c = state
        return [(out[b:b + 1], h[:, b:b + 1], c[:, b:b + 1]) for b in range(out.shape[0])]


class AdditiveJoint(nn.Module):
    """``head(act(e + p))`` over projected encoder frames and predictor outputs (a
    :class:`~oasr.models.transducer.TransducerJoiner`)."""

    def __init__(self, config: ParakeetRnntConfig):
        super().__init__()
        d = config.decoder_hidden_size
        j = config.joint_hidden_size or d
        self.durations = tuple(config.durations)
        self.encoder_projector = Linear(config.hidden_size, j)
        self.decoder_projector = Linear(d, j)
        self.head = Linear(j, config.vocab_size + len(self.durations))
        self._act = activation_fn(config.joint_act)

    def project_encoder(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.encoder_projector(hidden)

    def project_predictor(self, pred: torch.Tensor) -> torch.Tensor:
        return few_row_linear(self.decoder_projector, pred)

    def joint(self, enc_proj: torch.Tensor, pred_proj: torch.Tensor) -> torch.Tensor:
        return few_row_linear(self.head, self._act(enc_proj + pred_proj))


class LstmTransducerHeads:
    """The RNN-T heads of transformers' Parakeet / Nemotron models as a model mixin: the LSTM predictor at
    ``decoder``, the additive joint at ``joint`` (``encoder_projector`` / ``decoder.decoder_projector`` are
    the joint's in this layout), exposed to the core ``transducer`` family as ``predictor`` / ``joiner``."""

    weight_renames = ((r"^encoder_projector\.", "joint.encoder_projector."),
                      (r"^decoder\.decoder_projector\.", "joint.decoder_projector."))

    def _build_heads(self, config) -> None:
        self.decoder = LstmPredictor(config)
        self.joint = AdditiveJoint(config)

    @property
    def capabilities(self) -> frozenset[str]:
        return frozenset({"transducer"})

    @property
    def predictor(self) -> LstmPredictor:
        return self.decoder

    @property
    def joiner(self) -> AdditiveJoint:
        return self.joint



def squeeze_k1(state: dict[str, torch.Tensor], key: str) -> None:
    """A kernel-size-1 ``Conv1d`` weight (O, I, 1) becomes the (O, I) weight of a linear, in place."""
    weight = state.get(key)
    if weight is not None and weight.dim() == 3 and weight.shape[-1] == 1:
        state[key] = weight[..., 0]


class CtcHead:
    """A CTC head at ``ctc_head`` as a model mixin (transformers' ``ParakeetForCTC`` / ``LasrForCTC`` layout):
    upstream a kernel-size-1 ``Conv1d`` (weight (V, D, 1)), here a :class:`~oasr.layers.CtcProjection`
    (weight (V, D)), decoded by the core ``ctc`` family offline (``forward_offline``) and streaming
    (``ctc_log_probs``).  The model builds its ``encoder`` first, then calls :meth:`_build_ctc_head`."""

    def _build_ctc_head(self, config) -> None:
        self.ctc_head = CtcProjection(config.hidden_size, config.vocab_size)

    @property
    def capabilities(self) -> frozenset[str]:
        return frozenset({"ctc"})

    def remap_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = dict(super().remap_state_dict(state_dict))
        squeeze_k1(out, "ctc_head.weight")
        return out

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The CTC head's raw logits (what transformers' ``*ForCTC`` models return)."""
        return Linear.forward(self.ctc_head, hidden)

    def ctc_log_probs(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.ctc_head(hidden)

    def forward_offline(self, feats: torch.Tensor, feat_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden, lengths = self.encode_offline(feats, feat_lens)
        return self.ctc_head(hidden), lengths


__all__ = ["AdditiveJoint", "CtcHead", "LstmPredictor", "LstmTransducerHeads", "few_row_linear", "squeeze_k1"]
