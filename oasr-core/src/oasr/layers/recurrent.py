"""Recurrent layers of the waist."""

from __future__ import annotations

import torch
from torch import nn

from oasr.layers.derived import derived, row_major

#: the largest embedding, in multiples of layer 0's ``W_ih``, whose input-gate table :meth:`LSTM.embedded_step` keeps
TABLE_MAX_RATIO = 2


class LSTM(nn.LSTM):
    """``torch.nn.LSTM`` with its parameter names (``weight_ih_l0`` ...), batch-first by default.

    Subclassed rather than wrapped so checkpoint keys stay flat; the fused recurrent kernel is
    torch's own.  One time step on CPU in inference (a transducer predictor's step) runs layer by layer
    as one GEMM per layer instead: ``[x, h] @ [W_ih | W_hh]^T + (b_ih + b_hh)`` over a copy of the two
    weights laid out (input + hidden, 4 · hidden) row-major, then the gates (i, f, g, o, torch's
    order).  torch's CPU ``lstm`` hands every call to oneDNN, which reorders all the weights per call (a
    2 × 640 predictor step: ~35 ms), and ``torch.lstm_cell`` runs two sgemms over the (4 · hidden, in)
    weights (~2.8 ms); the one-row GEMM over the row-major copy streams the weights once (~1.8 ms,
    ``benchmarks/tdt_search.py``).  The copy is derived data (a second copy of the LSTM's weights,
    :func:`oasr.layers.derived.row_major`), so a weight change or ``.to()`` re-derives it.
    :meth:`embedded_step` (a step over embedding rows) also looks layer 0's input gates up in a table.
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, *, bias: bool = True,
                 batch_first: bool = True, proj_size: int = 0):
        super().__init__(input_size, hidden_size, num_layers, bias=bias, batch_first=batch_first,
                         proj_size=proj_size)

    def _single_step(self, x: torch.Tensor | nn.utils.rnn.PackedSequence) -> bool:
        return isinstance(x, torch.Tensor) and x.dim() == 3 and x.shape[1] == 1 and self._one_step_path(x.device)

    def _one_step_path(self, device: torch.device) -> bool:
        return (self.batch_first and not self.bidirectional and self.proj_size == 0 and device.type == "cpu"
                and not torch.is_grad_enabled() and (not self.training or self.dropout == 0))

    def _step_weights(self, layer: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Layer ``layer``'s ``[W_ih | W_hh]^T`` (in + hidden, 4 · hidden), contiguous, and ``b_ih + b_hh`` (1, 4 · hidden)."""
        names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh") if self.bias else ("weight_ih", "weight_hh")
        params = [getattr(self, f"{name}_l{layer}") for name in names]
        weight = row_major(self, *params[:2], name=f"step_l{layer}")
        if not self.bias:
            return weight, None
        return weight, derived(self, f"step_bias_l{layer}", params[2:], lambda: (params[2] + params[3])[None])

    def forward(self, input: torch.Tensor, hx: tuple[torch.Tensor, torch.Tensor] | None = None):
        if not self._single_step(input):
            return super().forward(input, hx)
        out, state = self._step(input[:, 0], None, hx)
        return out[:, None], state

    def embedded_step(self, ids: torch.Tensor, embedding: nn.Module,
                      hx: tuple[torch.Tensor, torch.Tensor] | None = None
                      ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """One time step whose inputs are the rows ``ids`` (B,) of ``embedding`` (a module with a (N, input_size)
        ``weight``, such as a transducer predictor's label embedding): the output (B, hidden) and ``(h, c)``.

        On the one-step CPU path, layer 0's input gates ``W_ih · e + b_ih + b_hh`` are rows of a table computed
        once for the whole embedding (derived data, rebuilt after a change of the embedding or layer 0's
        weights), so a step reads only layer 0's ``W_hh`` instead of both of its weights: a 2 × 640 predictor
        over a 1025-label embedding reads 19.5 MB instead of 26 MB per step (``benchmarks/tdt_search.py``).
        The table (N, 4 · hidden) is kept only while it is at most :data:`TABLE_MAX_RATIO` times the ``W_ih``
        it stands for (N ≤ 2 · input_size); a larger embedding takes ``forward`` over its looked-up rows."""
        weight = embedding.weight
        if (not self._one_step_path(weight.device) or ids.dim() != 1
                or weight.shape[0] > TABLE_MAX_RATIO * self.input_size):
            out, state = self(embedding(ids)[:, None], hx)
            return out[:, 0], state
        return self._step(None, self._input_gates(weight).index_select(0, ids), hx)

    def _input_gates(self, weight: torch.Tensor) -> torch.Tensor:
        """``weight @ W_ih_l0^T + (b_ih_l0 + b_hh_l0)`` (N, 4 · hidden), derived."""
        params = (self.weight_ih_l0, self.bias_ih_l0, self.bias_hh_l0) if self.bias else (self.weight_ih_l0,)

        def build() -> torch.Tensor:
            table = weight @ params[0].t()
            return table.add_(params[1] + params[2]) if self.bias else table

        return derived(self, "input_gates", (weight, *params), build)

    def _step(self, x: torch.Tensor | None, gates0: torch.Tensor | None,
              hx: tuple[torch.Tensor, torch.Tensor] | None) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """One step from inputs ``x`` (B, input_size), or from layer 0's input gates ``gates0`` (B, 4 · hidden).
        The gates (i, f, g, o, torch's order) become ``c = f · c_prev + i · g`` (one ``addcmul``) and
        ``h = o · tanh(c)``, their nonlinearities in place on the step's own gate tensor."""
        if hx is None:
            like = x if x is not None else gates0
            zeros = like.new_zeros(self.num_layers, like.shape[0], self.hidden_size)
            hx = (zeros, zeros)
        hs, cs = [], []
        for layer in range(self.num_layers):
            if layer == 0 and gates0 is not None:
                gates = torch.addmm(gates0, hx[0][0], row_major(self, self.weight_hh_l0, name="step_hh_l0"))
            else:
                weight, bias = self._step_weights(layer)
                xh = torch.cat((x, hx[0][layer]), 1)
                gates = xh @ weight if bias is None else torch.addmm(bias, xh, weight)
            i, f, g, o = gates.chunk(4, 1)
            c = torch.addcmul(f.sigmoid_() * hx[1][layer], i.sigmoid_(), g.tanh_())
            x = o.sigmoid_() * c.tanh()
            hs.append(x)
            cs.append(c)
        return x, (torch.stack(hs), torch.stack(cs))
