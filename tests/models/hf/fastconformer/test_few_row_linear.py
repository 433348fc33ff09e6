"""The joint's few-row linear (a row-major weight copy through ``addmm``) equals the module's own linear,
follows weight changes, and leaves other calls (more rows, autograd, 3-D inputs) to the module."""

from __future__ import annotations

import pytest
import torch

from oasr.layers import Linear
from oasr.layers.derived import kept
from oasr_models_hf.fastconformer.predictor import FEW_ROWS, few_row_linear


@pytest.mark.parametrize("rows", [1, 3, FEW_ROWS])
@pytest.mark.parametrize("bias", [True, False])
def test_few_row_linear_equals_module(rows, bias):
    torch.manual_seed(rows)
    lin = Linear(24, 40, bias=bias).eval()
    x = torch.randn(rows, 24)
    with torch.no_grad():
        got = few_row_linear(lin, x)
        assert kept(lin) == ("row_major",)  # the copy path ran
        ref = torch.nn.functional.linear(x, lin.weight, lin.bias)
        assert torch.allclose(got, ref, rtol=1e-5, atol=1e-6)
        lin.weight.mul_(-3.0)  # an in-place edit is followed
        assert torch.allclose(few_row_linear(lin, x), torch.nn.functional.linear(x, lin.weight, lin.bias),
                              rtol=1e-5, atol=1e-5)


def test_few_row_linear_leaves_other_calls_to_the_module():
    lin = Linear(8, 5).eval()
    with torch.no_grad():
        few_row_linear(lin, torch.randn(FEW_ROWS + 1, 8))
        few_row_linear(lin, torch.randn(2, 3, 8))
    out = few_row_linear(lin, torch.randn(2, 8, requires_grad=True))
    assert out.requires_grad
    assert kept(lin) == ()
