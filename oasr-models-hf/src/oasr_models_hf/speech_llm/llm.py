"""A Qwen2 causal LM on the layer waist, with a batched incremental surface over left-padded prompts.

Module names are transformers' ``Qwen2ForCausalLM`` (``model.layers.N.self_attn.q_proj``,
``model.layers.N.mlp.gate_proj``, ``lm_head`` ...).  The computation is Qwen2's: RMSNorm (accumulated in
float32), NeoX rotary embeddings, grouped-query attention (q/k/v with bias, o without), a SiLU-gated MLP.

The incremental surface the ``llm`` decode family drives:

* :meth:`Qwen2Lm.prefill` runs ``inputs_embeds`` (B, L, D) whose rows are **left**-padded (``valid``
  (B, L) marks real positions).  A row's positions count its real tokens (``cumsum(valid) - 1``, HF's
  masked-generation convention), so padding changes nothing a row computes.  K/V buffers of
  ``capacity`` columns are allocated once per layer; the prefill fills columns ``0 .. L-1``.
* :meth:`Qwen2Lm.step` feeds one token per row, writes its K/V into the next column in place and
  returns the next-token logits (B, V).  Every row shares the column index (left padding keeps the
  rows aligned); the buffers grow only when a request outlives its capacity.
* :meth:`Qwen2Lm.select` is an ``index_select`` over rows (repeats allowed: beam search expands a
  request into k rows and reorders rows onto their parents with it).
* :meth:`Qwen2Lm.merge` joins two states into one batch (continuous batching): the shorter one is
  shifted right, its new leading columns marked invalid.

Grouped-query attention never copies K/V per query head: the query heads sharing a K/V head are
folded into the query axis of one attention call.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch
import torch.nn.functional as F
from torch import nn

from oasr.errors import CapabilityError
from oasr.layers import Embedding, GatedMLP, Linear, RMSNorm, RotaryEmbedding, attend
from oasr_models_hf.speech_llm.config import TextConfig


class Qwen2Attention(nn.Module):
    def __init__(self, config: TextConfig):
        super().__init__()
        d, hd = config.hidden_size, config.dim_per_head
        self.n_heads, self.n_kv, self.head_dim = config.num_attention_heads, config.num_key_value_heads, hd
        self.q_proj = Linear(d, self.n_heads * hd, bias=True)
        self.k_proj = Linear(d, self.n_kv * hd, bias=True)
        self.v_proj = Linear(d, self.n_kv * hd, bias=True)
        self.o_proj = Linear(self.n_heads * hd, d, bias=False)

    def heads(self, x: torch.Tensor, proj: Linear, n: int) -> torch.Tensor:
        b, t, _ = x.shape
        return proj(x).view(b, t, n, self.head_dim).transpose(1, 2)

    def grouped(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """softmax(q kᵀ / √d) v with query heads folded onto their K/V head; ``allowed`` (B, 1, L, S)."""
        b, _, length, hd = q.shape
        rep = self.n_heads // self.n_kv
        qg = q.reshape(b, self.n_kv, rep * length, hd)
        mask = allowed[:, :, None].expand(b, 1, rep, length, allowed.shape[-1]).reshape(b, 1, rep * length, -1)
        out = attend(qg, k, v, mask=mask, scale=self.head_dim ** -0.5)
        return out.reshape(b, self.n_heads, length, hd).transpose(1, 2).reshape(b, length, self.n_heads * hd)


class Qwen2DecoderLayer(nn.Module):
    def __init__(self, config: TextConfig):
        super().__init__()
        self.self_attn = Qwen2Attention(config)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, "silu", bias=False)
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)


class Qwen2Model(nn.Module):
    def __init__(self, config: TextConfig):
        super().__init__()
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Qwen2DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)


@attrs.define(eq=False)
class LmState:
    """Per-row incremental state: K/V (B, Hkv, capacity, Dh) per layer, columns ``[0, length)`` written;
    ``valid`` (B, capacity) marks the columns holding a real token; ``positions`` (B,) is each row's
    next position id."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    valid: torch.Tensor
    positions: torch.Tensor
    length: int

    @property
    def batch_size(self) -> int:
        return int(self.positions.shape[0])

    @property
    def capacity(self) -> int:
        return int(self.keys[0].shape[2])


class Qwen2Lm(nn.Module):
    """``Qwen2ForCausalLM`` with the incremental surface (see the module docstring)."""

    supports_paged_kv = False
    supports_step_graphs = False

    def __init__(self, config: TextConfig):
        super().__init__()
        self.config = config
        self.model = Qwen2Model(config)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary = RotaryEmbedding(config.dim_per_head, base=config.rope_theta)

    @property
    def max_positions(self) -> int:
        return self.config.max_position_embeddings

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(ids)

    def _layers(self, x: torch.Tensor, positions: torch.Tensor, state: LmState, start: int,
                allowed: torch.Tensor) -> torch.Tensor:
        """Run every layer over ``x`` (B, L, D) whose K/V go to columns ``start .. start + L - 1``."""
        cos, sin = self.rotary.cos_sin(positions, x.dtype)
        end = start + x.shape[1]
        for i, layer in enumerate(self.model.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = self.rotary.apply(attn.heads(h, attn.q_proj, attn.n_heads), cos, sin)
            k = self.rotary.apply(attn.heads(h, attn.k_proj, attn.n_kv), cos, sin)
            state.keys[i][:, :, start:end] = k
            state.values[i][:, :, start:end] = attn.heads(h, attn.v_proj, attn.n_kv)
            out = attn.grouped(q, state.keys[i][:, :, :end], state.values[i][:, :, :end], allowed)
            h, x = layer.post_attention_layernorm.add_forward(attn.o_proj(out), x)
            x = x + layer.mlp(h)
        return self.model.norm(x)

    def _new_state(self, batch: int, capacity: int, dtype: torch.dtype, device: torch.device) -> LmState:
        c = self.config
        shape = (batch, c.num_key_value_heads, capacity, c.dim_per_head)
        return LmState(keys=[torch.zeros(shape, dtype=dtype, device=device) for _ in self.model.layers],
                       values=[torch.zeros(shape, dtype=dtype, device=device) for _ in self.model.layers],
                       valid=torch.zeros(batch, capacity, dtype=torch.bool, device=device),
                       positions=torch.zeros(batch, dtype=torch.long, device=device), length=0)

    def prefill(self, inputs_embeds: torch.Tensor, valid: torch.Tensor | None = None,
                capacity: int | None = None) -> tuple[LmState, torch.Tensor]:
        """Run left-padded prompts; returns the state and each row's next-token logits (B, V)."""
        batch, length, _ = inputs_embeds.shape
        device = inputs_embeds.device
        if valid is None:
            valid = torch.ones(batch, length, dtype=torch.bool, device=device)
        valid = valid.to(device=device, dtype=torch.bool)
        if bool((~valid[:, -1]).any()):
            raise ValueError("prefill expects left-padded prompts: every row's last position must be real")
        if length > self.max_positions:
            raise CapabilityError(f"prompt of {length} positions exceeds the LM's {self.max_positions}")
        state = self._new_state(batch, max(capacity or 0, length + 1), inputs_embeds.dtype, device)
        positions = (valid.long().cumsum(-1) - 1).masked_fill(~valid, 1)
        causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
        allowed = (causal[None] & valid[:, None, :])[:, None]
        hidden = self._layers(inputs_embeds, positions, state, 0, allowed)
        state.valid[:, :length] = valid
        state.positions = valid.long().sum(-1)
        state.length = length
        return state, self.lm_head(hidden[:, -1])

    def step(self, state: LmState, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (B,) at each row's next position; returns logits (B, V); updates ``state``."""
        if int(state.positions.max()) >= self.max_positions:
            raise CapabilityError(f"the LM reached its {self.max_positions} positions")
        if state.length >= state.capacity:
            self._grow(state, max(2 * state.capacity, state.length + 1))
        col = state.length
        state.valid[:, col] = True
        allowed = state.valid[:, None, None, : col + 1]
        x = self.embed(tokens.reshape(-1, 1))
        hidden = self._layers(x, state.positions[:, None], state, col, allowed)
        state.positions = state.positions + 1
        state.length = col + 1
        return self.lm_head(hidden[:, 0])

    def _grow(self, state: LmState, capacity: int) -> None:
        extra = capacity - state.capacity
        for bufs in (state.keys, state.values):
            for i, buf in enumerate(bufs):
                bufs[i] = F.pad(buf, (0, 0, 0, extra))
        state.valid = F.pad(state.valid, (0, extra))

    def select(self, state: LmState, index: torch.Tensor | Sequence[int]) -> LmState:
        """A new state whose row ``j`` is row ``index[j]`` of ``state`` (repeats allowed)."""
        index = torch.as_tensor(index, dtype=torch.long, device=state.positions.device)
        return LmState(keys=[k.index_select(0, index) for k in state.keys],
                       values=[v.index_select(0, index) for v in state.values],
                       valid=state.valid.index_select(0, index), positions=state.positions.index_select(0, index),
                       length=state.length)

    def merge(self, a: LmState, b: LmState) -> LmState:
        """One state holding the rows of ``a`` then those of ``b``, right-aligned on a common column count."""
        length = max(a.length, b.length)
        capacity = max(a.capacity - a.length, b.capacity - b.length) + length

        def place(state: LmState, buf: torch.Tensor) -> torch.Tensor:
            shift = length - state.length
            out = buf.new_zeros(buf.shape[:2] + (capacity,) + buf.shape[3:])
            out[:, :, shift:length] = buf[:, :, : state.length]
            return out

        def place_valid(state: LmState) -> torch.Tensor:
            shift = length - state.length
            out = state.valid.new_zeros(state.batch_size, capacity)
            out[:, shift:length] = state.valid[:, : state.length]
            return out

        return LmState(keys=[torch.cat([place(a, x), place(b, y)]) for x, y in zip(a.keys, b.keys, strict=True)],
                       values=[torch.cat([place(a, x), place(b, y)]) for x, y in zip(a.values, b.values, strict=True)],
                       valid=torch.cat([place_valid(a), place_valid(b)]),
                       positions=torch.cat([a.positions, b.positions]), length=length)
