"""Recurrent layers of the waist."""

from __future__ import annotations

import torch
from torch import nn


class LSTM(nn.LSTM):
    """``torch.nn.LSTM`` with its parameter names (``weight_ih_l0`` ...), batch-first by default.

    Subclassed rather than wrapped so checkpoint keys stay flat; the fused recurrent kernel is
    torch's own.  One time step on CPU in inference (a transducer predictor's step) runs layer by layer
    through ``torch.lstm_cell`` instead: torch's CPU ``lstm`` hands every call to oneDNN, which reorders
    all the weights per call (a 2 × 640 predictor step: ~35 ms against ~7 ms).
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, *, bias: bool = True,
                 batch_first: bool = True, proj_size: int = 0):
        super().__init__(input_size, hidden_size, num_layers, bias=bias, batch_first=batch_first,
                         proj_size=proj_size)

    def _single_step(self, x: torch.Tensor | nn.utils.rnn.PackedSequence) -> bool:
        return (isinstance(x, torch.Tensor) and x.dim() == 3 and x.shape[1] == 1 and self.batch_first and not self.bidirectional
                and self.proj_size == 0 and x.device.type == "cpu" and not torch.is_grad_enabled()
                and (not self.training or self.dropout == 0))

    def forward(self, input: torch.Tensor, hx: tuple[torch.Tensor, torch.Tensor] | None = None):
        if not self._single_step(input):
            return super().forward(input, hx)
        if hx is None:
            zeros = input.new_zeros(self.num_layers, input.shape[0], self.hidden_size)
            hx = (zeros, zeros)
        x, hs, cs = input[:, 0], [], []
        for layer in range(self.num_layers):
            weights = [getattr(self, f"{name}_l{layer}") if self.bias or name.startswith("weight") else None
                       for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
            h, c = torch.lstm_cell(x, (hx[0][layer], hx[1][layer]), *weights)
            hs.append(h)
            cs.append(c)
            x = h
        return x[:, None], (torch.stack(hs), torch.stack(cs))
