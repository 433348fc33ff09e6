"""Attention of the waist: one core over already-projected q/k/v, on torch's SDPA.

Families keep their own projection names (WeNet's ``linear_q``…, HF's ``q_proj``…) and call
:func:`attend` or the :class:`Attention` core module; :class:`MultiHeadAttention` is the common case
with configurable projection names.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from oasr.layers.linear import Linear


def key_padding_mask(key_lengths: torch.Tensor, max_len: int) -> torch.Tensor:
    """(B,) lengths → (B, 1, 1, Tk) bool, True where a key is real."""
    ar = torch.arange(max_len, device=key_lengths.device)
    return (ar[None, :] < key_lengths[:, None])[:, None, None, :]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, key_lengths: torch.Tensor | None = None,
           mask: torch.Tensor | None = None, bias: torch.Tensor | None = None, scale: float | None = None,
           causal: bool = False) -> torch.Tensor:
    """softmax(q·kᵀ·scale + bias + mask)·v over (B, H, T, D) tensors.

    ``mask`` is boolean (True = may attend), broadcast to (B, H, Tq, Tk); ``key_lengths`` masks padded
    keys; ``bias`` is an additive float score term (relative positions).  A query row with no visible
    key yields zeros instead of NaN.
    """
    allowed = mask
    if key_lengths is not None:
        kp = key_padding_mask(key_lengths, k.shape[-2])
        allowed = kp if allowed is None else (allowed & kp)
    if causal:
        tq, tk = q.shape[-2], k.shape[-2]
        cm = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril(tk - tq)
        allowed = cm if allowed is None else (allowed & cm)
    attn_mask = None
    dead_rows = None
    if allowed is not None:
        dead_rows = ~allowed.any(dim=-1, keepdim=True)
        if bool(dead_rows.any()):
            allowed = allowed | dead_rows
        else:
            dead_rows = None
    if bias is not None:
        attn_mask = bias.to(q.dtype)
        if allowed is not None:
            attn_mask = attn_mask.masked_fill(~allowed, float("-inf"))
    else:
        attn_mask = allowed
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale)
    if dead_rows is not None:
        out = out.masked_fill(dead_rows, 0.0)
    return out


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    b, t, d = x.shape
    return x.view(b, t, n_heads, d // n_heads).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    b, h, t, d = x.shape
    return x.transpose(1, 2).reshape(b, t, h * d)


class Attention(nn.Module):
    """The parameter-free attention core (exists so the waist test sees attention as a waist module)."""

    def __init__(self, n_heads: int, head_dim: int, scale: float | None = None):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, head_dim
        self.scale = scale if scale is not None else head_dim ** -0.5

    def forward(self, q, k, v, **kwargs) -> torch.Tensor:
        kwargs.setdefault("scale", self.scale)
        return attend(q, k, v, **kwargs)


class MultiHeadAttention(nn.Module):
    """Projections + :class:`Attention`, with the projection attribute names a checkpoint uses."""

    def __init__(self, d_model: int, n_heads: int, *, names=("q_proj", "k_proj", "v_proj", "out_proj"),
                 bias=(True, True, True, True), kv_dim: int | None = None):
        super().__init__()
        kv_dim = kv_dim or d_model
        self.names = tuple(names)
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.core = Attention(n_heads, self.head_dim)
        for name, in_dim, has_bias in zip(self.names[:3], (d_model, kv_dim, kv_dim), bias[:3], strict=True):
            setattr(self, name, Linear(in_dim, d_model, bias=has_bias))
        setattr(self, self.names[3], Linear(d_model, d_model, bias=bias[3]))

    def project(self, x: torch.Tensor, which: int) -> torch.Tensor:
        return split_heads(getattr(self, self.names[which])(x), self.n_heads)

    def forward(self, x: torch.Tensor, memory: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
        src = x if memory is None else memory
        q, k, v = self.project(x, 0), self.project(src, 1), self.project(src, 2)
        return getattr(self, self.names[3])(merge_heads(self.core(q, k, v, **kwargs)))
