"""Recurrent layers of the waist."""

from __future__ import annotations

import torch
from torch import nn

from oasr.layers.derived import derived, row_major


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
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, *, bias: bool = True,
                 batch_first: bool = True, proj_size: int = 0):
        super().__init__(input_size, hidden_size, num_layers, bias=bias, batch_first=batch_first,
                         proj_size=proj_size)

    def _single_step(self, x: torch.Tensor | nn.utils.rnn.PackedSequence) -> bool:
        return (isinstance(x, torch.Tensor) and x.dim() == 3 and x.shape[1] == 1 and self.batch_first and not self.bidirectional
                and self.proj_size == 0 and x.device.type == "cpu" and not torch.is_grad_enabled()
                and (not self.training or self.dropout == 0))

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
        if hx is None:
            zeros = input.new_zeros(self.num_layers, input.shape[0], self.hidden_size)
            hx = (zeros, zeros)
        x, hs, cs = input[:, 0], [], []
        for layer in range(self.num_layers):
            weight, bias = self._step_weights(layer)
            xh = torch.cat((x, hx[0][layer]), 1)
            gates = xh @ weight if bias is None else torch.addmm(bias, xh, weight)
            i, f, g, o = gates.chunk(4, 1)
            c = torch.sigmoid(f) * hx[1][layer] + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            hs.append(h)
            cs.append(c)
            x = h
        return x[:, None], (torch.stack(hs), torch.stack(cs))
