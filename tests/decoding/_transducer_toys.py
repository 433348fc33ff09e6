"""Tiny transducer pieces for the search tests, seeded and widened so tokens vary.

- :class:`WindowPredictor`: icefall's stateless predictor in miniature: the state is the last
  ``context_size`` labels, the start window ``[-1] * (context_size - 1) + [blank]``, a negative label
  embeds to zero; output ``relu(W · concat(embeddings))``.  ``decoder_out(window)`` is the plain
  function of a label window the test oracles call.
- :class:`LstmPredictor`: a recurrent predictor (label_window_state False) whose start state is the
  LSTM cell run once on the zero embedding from a zero state; ``cell_step`` is the plain recurrence.
- :class:`ToyJoiner`: ``out(tanh(enc(e) + pred(p)))`` with optional TDT duration logits.
- :class:`ToyTransducerModel`: a BaseAsrModel with a linear "encoder" (no subsampling), a predictor and a
  joiner, for the strategy and engine tests.
"""

from __future__ import annotations

import attrs
import torch
from torch import nn

from oasr.models.base import BaseAsrModel, BaseEncoder, BaseModelConfig


def _seeded(module: nn.Module, seed: int, scale: float) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * scale)
    return module


class WindowPredictor(nn.Module):
    label_window_state = True

    def __init__(self, vocab: int, dim: int = 8, context_size: int = 2, blank_id: int = 0, seed: int = 0,
                 scale: float = 1.0, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.blank_id = blank_id
        self.context_size = context_size
        self.embedding = nn.Embedding(vocab, dim, dtype=dtype)
        self.proj = nn.Linear(dim * context_size, dim, dtype=dtype)
        _seeded(self, seed, scale)

    def decoder_out(self, window: torch.Tensor) -> torch.Tensor:
        """(B, context) labels -> (B, dim)."""
        emb = self.embedding(window.clamp(min=0)) * (window >= 0).unsqueeze(-1).to(self.embedding.weight.dtype)
        return torch.relu(self.proj(emb.flatten(1)))

    # -- TransducerPredictor --
    def init_state(self, batch_size: int, device) -> torch.Tensor:
        start = [-1] * (self.context_size - 1) + [self.blank_id]
        return torch.tensor([start] * batch_size, dtype=torch.long, device=device).reshape(batch_size, -1)

    def predict(self, state: torch.Tensor) -> torch.Tensor:
        return self.decoder_out(state)

    def advance(self, state, tokens, emit):
        shifted = torch.cat([state[:, 1:], tokens[:, None]], dim=1)
        return torch.where(emit[:, None], shifted, state)

    def select(self, state, index):
        return state.index_select(0, index)

    def stack_states(self, states):
        return torch.cat(states, dim=0)

    def unstack_states(self, state):
        return list(state.split(1, dim=0))


class LstmPredictor(nn.Module):
    label_window_state = False

    def __init__(self, vocab: int, dim: int = 8, blank_id: int = 0, seed: int = 0, scale: float = 1.0):
        super().__init__()
        self.blank_id = blank_id
        self.embedding = nn.Embedding(vocab, dim)
        self.cell = nn.LSTMCell(dim, dim)
        _seeded(self, seed, scale)

    def cell_step(self, label: int | None, h: torch.Tensor, c: torch.Tensor):
        """One recurrence step on ``label``'s embedding (None: the zero embedding), (1, dim) states."""
        weight = self.embedding.weight
        x = weight.new_zeros(1, weight.shape[1]) if label is None else weight[label][None]
        return self.cell(x, (h, c))

    def init_state(self, batch_size, device):
        zero = self.embedding.weight.new_zeros(batch_size, self.embedding.embedding_dim).to(device)
        h, c = self.cell(zero, (zero, zero))
        return h, c

    def predict(self, state):
        return state[0]

    def advance(self, state, tokens, emit):
        h, c = state
        nh, nc = self.cell(self.embedding(tokens), (h, c))
        keep = emit[:, None]
        return torch.where(keep, nh, h), torch.where(keep, nc, c)

    def select(self, state, index):
        return tuple(s.index_select(0, index) for s in state)

    def stack_states(self, states):
        return tuple(torch.cat(parts, dim=0) for parts in zip(*states, strict=True))

    def unstack_states(self, state):
        return [tuple(s[i:i + 1] for s in state) for i in range(state[0].shape[0])]


class ToyJoiner(nn.Module):
    def __init__(self, enc_dim: int, pred_dim: int, vocab: int, joiner_dim: int = 16, durations=(), seed: int = 1,
                 scale: float = 1.0, out_scale: float = 3.0, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.durations = tuple(durations)
        self.enc = nn.Linear(enc_dim, joiner_dim, dtype=dtype)
        self.pred = nn.Linear(pred_dim, joiner_dim, dtype=dtype)
        self.out = nn.Linear(joiner_dim, vocab + len(self.durations), dtype=dtype)
        _seeded(self, seed, scale)
        with torch.no_grad():
            self.out.weight.mul_(out_scale)

    def project_encoder(self, hidden):
        return self.enc(hidden)

    def project_predictor(self, pred):
        return self.pred(pred)

    def joint(self, enc_proj, pred_proj):
        return self.out(torch.tanh(enc_proj + pred_proj))

    def logits(self, hidden_t: torch.Tensor, pred_out: torch.Tensor) -> torch.Tensor:
        """The plain joint of one unprojected frame (D,) and predictor output (1, D_pred) -> (V [+ D],)."""
        return self.out(torch.tanh(self.enc(hidden_t) + self.pred(pred_out)))[0]


@attrs.define
class ToyTransducerConfig(BaseModelConfig):
    feat_dim: int = 6
    vocab: int = 7
    recurrent: bool = False
    durations: tuple[int, ...] = ()


class ToyEncoder(BaseEncoder):
    subsampling_rate = 1

    def __init__(self, feat_dim: int):
        super().__init__()
        self.linear = nn.Linear(feat_dim, feat_dim)
        _seeded(self, 5, 1.0)

    @property
    def output_size(self) -> int:
        return self.linear.out_features


class ToyTransducerModel(BaseAsrModel):
    config_class = ToyTransducerConfig

    def __init__(self, config: ToyTransducerConfig):
        super().__init__(config)
        self.encoder = ToyEncoder(config.feat_dim)
        if config.recurrent:
            self.predictor = LstmPredictor(config.vocab, dim=8, seed=2, scale=1.0)
        else:
            self.predictor = WindowPredictor(config.vocab, dim=8, context_size=2, seed=2, scale=1.0)
        self.joiner = ToyJoiner(config.feat_dim, 8, config.vocab, durations=config.durations, seed=3)

    @property
    def capabilities(self):
        return frozenset({"transducer"})

    def encode_offline(self, feats, feat_lens):
        return self.encoder.linear(feats), feat_lens
