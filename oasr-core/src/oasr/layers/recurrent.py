"""Recurrent layers of the waist."""

from __future__ import annotations

from torch import nn


class LSTM(nn.LSTM):
    """``torch.nn.LSTM`` with its parameter names (``weight_ih_l0`` ...), batch-first by default.

    Subclassed rather than wrapped so checkpoint keys stay flat; the fused recurrent kernel is
    torch's own.
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, *, bias: bool = True,
                 batch_first: bool = True, proj_size: int = 0):
        super().__init__(input_size, hidden_size, num_layers, bias=bias, batch_first=batch_first,
                         proj_size=proj_size)
