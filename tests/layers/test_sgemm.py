"""``oasr.layers.packed.sgemm``: MKL's packed sgemm at the call's own row count, the activation or the scaled
residual add after it, against the reference ops (``F.linear`` and the activation), taken (a packed copy kept),
repacked after a weight change, and the reference ops under autograd, ``OASR_KERNELS=0`` and on int8 layers."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from oasr.layers import Linear, PointwiseConv1d, packed, quant
from oasr.layers.derived import forget, kept

pytestmark = pytest.mark.skipif(not packed.sgemm_available(), reason="torch built without MKL: no packed sgemm")

ACTIVATIONS = {"none": lambda y: y, "silu": F.silu, "relu": F.relu, "gelu": F.gelu}


def _reference(layer, x):
    return F.linear(x, layer.weight.reshape(layer.weight.size(0), -1), layer.bias)


@pytest.mark.parametrize("rows", [1, 7, 37, 100, 1100])
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_sgemm_equals_linear_and_activation_at_any_row_count(rows, activation):
    torch.manual_seed(rows)
    layer = Linear(48, 80)
    x = torch.randn(rows, 48)
    forget(layer)
    with torch.no_grad():
        out = packed.sgemm(layer, x, activation)
        ref = ACTIVATIONS[activation](_reference(layer, x))
    assert ("packed", "sgemm") in kept(layer)  # the packed sgemm ran
    assert out.shape == (rows, 80)
    assert torch.allclose(out, ref, rtol=1e-6, atol=1e-6)


def test_sgemm_reads_batched_strided_input_and_a_pointwise_conv_weight():
    torch.manual_seed(1)
    layer = PointwiseConv1d(32, 24)  # weight (out, in, 1)
    x = torch.randn(3, 17, 64)[..., ::2]  # (B, T, C), not contiguous
    with torch.no_grad():
        out = packed.sgemm(layer, x)
        ref = _reference(layer, x)
    assert ("packed", "sgemm") in kept(layer)
    assert out.shape == (3, 17, 24) and torch.allclose(out, ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_sgemm_residual_is_residual_plus_scaled_linear(scale):
    torch.manual_seed(2)
    layer = Linear(64, 32)
    x, residual = torch.randn(2, 37, 64), torch.randn(2, 37, 32)
    kept_residual = residual.clone()
    with torch.no_grad():
        out = packed.sgemm(layer, x, residual=residual, scale=scale)
        ref = residual + scale * _reference(layer, x)
        unscaled = residual + _reference(layer, x)
    assert ("packed", "sgemm") in kept(layer)
    assert torch.allclose(out, ref, rtol=1e-6, atol=1e-6)
    assert torch.equal(residual, kept_residual)  # the caller's residual is read, not written
    if scale != 1.0:
        assert float((out - unscaled).abs().max()) > 1e-2  # the scale is applied


def test_sgemm_repacks_after_a_weight_change():
    torch.manual_seed(3)
    layer = Linear(40, 40)
    x = torch.randn(9, 40)
    with torch.no_grad():
        before = packed.sgemm(layer, x)
        layer.weight.mul_(-2.0)  # in place: the version counter moves
        after = packed.sgemm(layer, x)
        assert torch.allclose(after, _reference(layer, x), rtol=1e-6, atol=1e-6)
    assert float((after - before).abs().max()) > 1e-2
    state = {k: v * 3.0 for k, v in layer.state_dict().items()}
    layer.load_state_dict(state)
    with torch.no_grad():
        assert torch.allclose(packed.sgemm(layer, x), _reference(layer, x), rtol=1e-6, atol=1e-5)


def test_sgemm_runs_the_reference_ops_off_the_fast_path(monkeypatch):
    torch.manual_seed(4)
    layer = Linear(16, 8)
    x, residual = torch.randn(5, 16), torch.randn(5, 8)
    forget(layer)
    out = packed.sgemm(layer, x, "silu")  # grad enabled: differentiable reference ops, nothing packed
    assert out.requires_grad and not kept(layer)
    with torch.no_grad():
        assert torch.allclose(out, F.silu(_reference(layer, x)), rtol=1e-6, atol=1e-6)
    added = packed.sgemm(layer, x, residual=residual, scale=0.5)
    assert added.requires_grad and not kept(layer)
    monkeypatch.setenv("OASR_KERNELS", "0")
    with torch.no_grad():
        off = packed.sgemm(layer, x, residual=residual, scale=0.5)
    assert not kept(layer)
    assert torch.allclose(off, residual + 0.5 * _reference(layer, x), rtol=1e-6, atol=1e-6)
    monkeypatch.delenv("OASR_KERNELS")
    quant.quantize_model_int8(torch.nn.Sequential(layer))  # an int8 layer keeps its own kernel
    with torch.no_grad():
        assert torch.allclose(packed.sgemm(layer, x), layer(x), rtol=1e-6, atol=1e-6)
    assert not kept(layer)
