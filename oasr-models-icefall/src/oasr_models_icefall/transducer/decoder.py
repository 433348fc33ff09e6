"""icefall's stateless prediction network (``StatelessDecoder``), driven as a transducer predictor.

The network sees only the last ``context_size`` labels: an embedding of each, then, when
``context_size > 1``, a grouped convolution over that window (groups of 4 channels, no bias) and a
ReLU.  A negative label embeds to the zero vector — icefall starts every hypothesis from the window
``[-1] * (context_size - 1) + [blank]``, which is what its models were trained on (``[blank] + y``
left-padded with zero embeddings); a window of blanks is a different input wherever the blank's
embedding row is learned, as it is in the Zipformer recipes.

The search state is that window itself, a (B, context_size) int64 tensor, so the predictor is a
:class:`~oasr.models.transducer.TransducerPredictor` with ``label_window_state`` True: rows
``index_select`` cleanly and modified beam search can reorder them onto their parents.
"""

from __future__ import annotations

import torch
from torch import nn

from oasr import layers
from oasr.errors import ConfigError
from oasr_models_icefall.transducer.config import StatelessDecoderConfig


class StatelessDecoder(nn.Module):
    """``embedding`` (+ ``conv`` over the label window and a ReLU when ``context_size > 1``).

    Parameter names are icefall's (``decoder.embedding.weight``, ``decoder.conv.weight``), so a
    release's ``decoder.*`` tensors load 1:1.
    """

    #: the state is a window of the last labels (see the module docstring)
    label_window_state = True

    def __init__(self, config: StatelessDecoderConfig):
        super().__init__()
        if config.context_size < 1:
            raise ConfigError(f"StatelessDecoder: context_size must be >= 1, got {config.context_size}",
                              key="context_size")
        if config.context_size > 1 and config.decoder_dim % config.conv_group_size:
            raise ConfigError(f"StatelessDecoder: decoder_dim {config.decoder_dim} is not a multiple of the "
                              f"convolution's group size {config.conv_group_size}", key="decoder_dim")
        self.config = config
        self.blank_id = config.blank_id
        self.context_size = config.context_size
        self.vocab_size = config.vocab_size
        self.embedding = layers.Embedding(config.vocab_size, config.decoder_dim)
        if config.context_size > 1:
            self.conv = layers.Conv1d(config.decoder_dim, config.decoder_dim, config.context_size,
                                      groups=config.decoder_dim // config.conv_group_size, bias=False)
            self.relu = layers.Relu()
        else:
            self.conv = None
            self.relu = None

    @property
    def output_size(self) -> int:
        return self.config.decoder_dim

    def embed(self, labels: torch.Tensor) -> torch.Tensor:
        """(..., U) int labels → (..., U, D); a negative label embeds to zeros."""
        labels = labels.to(torch.int64)
        out = self.embedding(labels.clamp(min=0))
        return out * (labels >= 0).unsqueeze(-1).to(out.dtype)

    def forward(self, labels: torch.Tensor) -> torch.Tensor:
        """(B, U) labels → (B, U, D): the output after each prefix, the window left-padded with
        negative (zero-embedding) labels — icefall's ``Decoder.forward(y, need_pad=True)``."""
        if self.context_size > 1:
            pad = labels.new_full((labels.shape[0], self.context_size - 1), -1)
            labels = torch.cat([pad, labels], dim=1)
        emb = self.embed(labels)
        if self.conv is None:
            return emb
        return self.relu(self.conv(emb))

    # -- TransducerPredictor ------------------------------------------------------------------------
    def init_state(self, batch_size: int, device: torch.device | str | None = None) -> torch.Tensor:
        """(B, context_size) windows ``[-1] * (context_size - 1) + [blank]``."""
        window = [-1] * (self.context_size - 1) + [self.blank_id]
        return torch.tensor(window, dtype=torch.int64, device=device).repeat(batch_size, 1)

    def predict(self, state: torch.Tensor) -> torch.Tensor:
        """(B, context_size) windows → (B, D) predictor outputs (before the joiner's projection)."""
        emb = self.embed(state)
        if self.conv is None:
            return emb[:, 0]
        return self.relu(self.conv(emb))[:, 0]

    def advance(self, state: torch.Tensor, tokens: torch.Tensor, emit: torch.Tensor) -> torch.Tensor:
        """The windows after rows with ``emit`` True took ``tokens``; other rows unchanged."""
        tokens = tokens.to(device=state.device, dtype=state.dtype)
        shifted = torch.cat([state[:, 1:], tokens.unsqueeze(1)], dim=1)
        return torch.where(emit.to(state.device).unsqueeze(1), shifted, state)

    def select(self, state: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return state.index_select(0, index.to(state.device))

    def stack_states(self, states: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(states, dim=0)

    def unstack_states(self, state: torch.Tensor) -> list[torch.Tensor]:
        return list(state.split(1, dim=0))
