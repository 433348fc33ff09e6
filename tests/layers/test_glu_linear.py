"""Core's GLU-fused GEMM (``oasr.layers.packed.glu_linear``): two GEMMs over the packed halves, the gate's sigmoid
and the product as their epilogues, equal to ``glu(linear(x))``, taken, repacked after a weight change."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from oasr.layers import PointwiseConv1d, packed
from oasr.layers.derived import kept

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


def _reference(layer, x):
    return F.glu(F.linear(x, layer.weight.squeeze(-1), layer.bias), dim=-1)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", [16, 64, 100])
def test_equals_glu_of_the_linear(bias, rows):
    torch.manual_seed(rows)
    layer = PointwiseConv1d(40, 2 * 24, bias=bias)
    x = torch.randn(rows, 40)
    with torch.inference_mode():
        out = packed.glu_linear(layer, x, min_rows=16)
    assert ("packed", "glu") in kept(layer)  # the fused path was taken
    ref = _reference(layer, x).detach()
    assert out.shape == (rows, 24)
    assert float((out - ref).abs().max() / ref.abs().max()) < 1e-5
    value, gate = F.linear(x, layer.weight.squeeze(-1), layer.bias).detach().chunk(2, dim=-1)
    swapped = gate * torch.sigmoid(value)
    assert float((out - swapped).abs().max()) > 1e-3  # value and gate halves are not swapped


def test_follows_a_weight_change_and_falls_back_under_grad():
    torch.manual_seed(0)
    layer = PointwiseConv1d(32, 64)
    x = torch.randn(70, 32)
    with torch.inference_mode():
        before = packed.glu_linear(layer, x)
    with torch.no_grad():
        layer.weight[40:].mul_(-2.0)  # the gate half, in place
    with torch.inference_mode():
        after = packed.glu_linear(layer, x)
    ref = _reference(layer, x).detach()
    assert float((after - ref).abs().max() / ref.abs().max()) < 1e-5
    assert float((after - before).abs().max()) > 1e-2
    grad = packed.glu_linear(layer, x)
    assert grad.requires_grad and float((grad.detach() - ref).abs().max() / ref.abs().max()) < 1e-5
