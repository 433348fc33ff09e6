"""oasr-kernels' int8 attention core (slot ``int8_attention``): the scheme its docstring states, checked against an
independent float64 implementation of it; close to the float32 core on time-correlated activations and closer than
plain 8-bit rounding of the weights would be; the same numbers from strided views and for a batch item alone."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from oasr.layers._backend import kernel
from oasr_kernels import attention
from oasr_kernels.attention import available

pytestmark = pytest.mark.skipif(not available(), reason="this torch has no CPU torch._int_mm")


def int8_attention(*args, **kwargs) -> torch.Tensor:
    """The slot's scheme on every CPU (without VNNI the slot itself runs SDPA, the last test)."""
    return attention.int8_attention(*args, int8=True, **kwargs)


def _speechlike(n: int, frames: int, heads: int, dim: int, seed: int) -> torch.Tensor:
    """(n, frames, 3, heads, dim) q/k/v that vary smoothly along the frames, as an encoder's do, plus noise."""
    gen = torch.Generator().manual_seed(seed)
    t = torch.linspace(0, 8, frames)[None, :, None, None, None]
    rate = 0.5 + torch.rand(n, 1, 3, heads, dim, generator=gen) * 2
    phase = torch.rand(n, 1, 3, heads, dim, generator=gen) * 6
    gain = 0.5 + torch.rand(n, 1, 3, heads, dim, generator=gen) * 2  # channels of different ranges
    return gain * torch.sin(t * rate + phase) + 0.2 * torch.randn(n, frames, 3, heads, dim, generator=gen)


def _reference(q, k, v, scale, weights="diffused"):
    """The documented scheme in float64 and plain torch: k and v per channel, q (times the key scales) per row,
    weights 255 * exp(score - max) rounded along the frames with the error carried (``"diffused"``), each on its
    own (``"rounded"``) or not at all (``"exact"``)."""
    q, k, v = (x.double().transpose(1, 2) for x in (q, k, v))  # (N, H, T, D)

    def grid(x, dim):
        amax = x.abs().amax(dim, keepdim=True)
        step = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
        return torch.round(x / step), step

    kq, ks = grid(k, -2)
    qq, qs = grid(q * ks, -1)
    vq, vs = grid(v, -2)
    scores = (qq @ kq.transpose(-1, -2)) * qs * scale
    e = 255 * torch.exp(scores - scores.amax(-1, keepdim=True))
    if weights == "diffused":
        w = torch.empty_like(e)
        carry = torch.zeros_like(e[..., 0])
        for t in range(e.shape[-1]):
            x = e[..., t] + carry
            w[..., t] = torch.clamp(torch.round(x), max=255)
            carry = x - w[..., t]
    else:
        w = torch.round(e) if weights == "rounded" else e
    return ((w @ vq) * vs / w.sum(-1, keepdim=True)).transpose(1, 2)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("shape", [(1, 1500, 6, 64), (2, 300, 4, 32), (3, 7, 2, 8), (1, 1, 1, 4), (2, 130, 3, 20)])
def test_the_kernel_is_the_documented_scheme(shape):
    n, frames, heads, dim = shape
    q, k, v = _speechlike(n, frames, heads, dim, seed=frames).unbind(2)
    scale = dim ** -0.5
    got = int8_attention(q, k, v, scale)
    assert got.shape == (n, frames, heads, dim) and got.dtype == torch.float32
    # float32 against float64 moves a rounding here and there; the carry absorbs it at the next frame
    assert _rel(got, _reference(q, k, v, scale)) < 2e-4
    assert kernel("int8_attention") is attention.int8_attention, "registered in its slot"


def test_close_to_the_float_core_and_closer_than_plain_rounding():
    q, k, v = _speechlike(2, 1500, 6, 64, seed=1).unbind(2)
    scale = 64 ** -0.5
    exact = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           scale=scale).transpose(1, 2)
    got = int8_attention(q, k, v, scale)
    assert _rel(got, exact) < 1e-2
    # the weights' rounding alone (the same int8 q, k, v): diffused along the frames against each on its own
    unrounded = _reference(q, k, v, scale, weights="exact")
    assert _rel(got, unrounded) * 3 < _rel(_reference(q, k, v, scale, weights="rounded"), unrounded)


def test_strided_views_and_batch_mates_change_nothing():
    qkv = _speechlike(3, 200, 4, 16, seed=2)
    q, k, v = qkv.unbind(2)  # views into one fused projection
    scale = 0.25
    strided = int8_attention(q, k, v, scale)
    contiguous = int8_attention(q.contiguous(), k.contiguous(), v.contiguous(), scale)
    assert torch.equal(strided, contiguous)
    alone = int8_attention(q[1:2], k[1:2], v[1:2], scale, block_rows=64)
    assert torch.equal(alone, strided[1:2]), "neither batch mates nor the query block size change a row"


def test_degenerate_inputs():
    zero = torch.zeros(1, 5, 2, 8)
    assert torch.equal(int8_attention(zero, zero, zero, 0.3), zero)  # zero ranges take scale 1, not 0/0
    q, k, v = _speechlike(1, 40, 2, 8, seed=3).unbind(2)
    constant_keys = torch.ones_like(k)  # every score equal: the mean of the values
    got = int8_attention(q, constant_keys, v, 0.5)
    assert torch.allclose(got, v.mean(1, keepdim=True).expand_as(v), atol=2e-2 * float(v.abs().max()))
    assert math.isfinite(float(int8_attention(q * 1e4, k * 1e4, v, 1.0).abs().max()))  # one-hot rows


def test_the_float_core_where_the_int8_products_are_slow(monkeypatch):
    """Without VNNI (``fast()`` False) oneDNN's int8 product is exact but slow: the slot runs SDPA's float32 core, as
    it does with ``int8=False``; ``int8=True`` still runs the scheme."""
    q, k, v = _speechlike(1, 60, 2, 8, seed=4).unbind(2)
    exact = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           scale=0.5).transpose(1, 2)
    monkeypatch.setattr(attention, "fast", lambda: False)
    assert torch.allclose(attention.int8_attention(q, k, v, 0.5), exact, atol=1e-6)
    assert torch.allclose(attention.int8_attention(q, k, v, 0.5, int8=False), exact, atol=1e-6)
    assert _rel(int8_attention(q, k, v, 0.5), _reference(q, k, v, 0.5)) < 2e-4
    assert not torch.allclose(int8_attention(q, k, v, 0.5), exact, atol=1e-6)
