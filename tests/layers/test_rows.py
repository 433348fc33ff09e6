"""The few-row linear seam (oasr.layers.rows) and oasr-kernels' ``row_linear`` kernel behind it: the reference's
numbers (float32: up to summation order; int8: the dequantized weights exactly, the activations on a 16-bit grid), taken
where it should be and nowhere else."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from oasr.layers import Linear, LinearActivation, rows
from oasr.layers.quant import quantize_model_int8


def _linear(n_in: int, n_out: int, bias: bool = True, activation: str | None = None, seed: int = 0) -> Linear:
    torch.manual_seed(seed)
    return (Linear(n_in, n_out, bias) if activation is None else LinearActivation(n_in, n_out, activation, bias)).eval()


@pytest.mark.parametrize("n_rows", [1, 2, rows.MAX_ROWS])
@pytest.mark.parametrize("n_in,n_out", [(384, 384), (64, 1536), (1536, 72), (7, 5)])
@pytest.mark.parametrize("bias", [True, False])
def test_float32_rows_equal_f_linear(row_kernel_calls, n_rows, n_in, n_out, bias):
    lin = _linear(n_in, n_out, bias)
    x = torch.randn(n_rows, n_in)
    residual = torch.randn(n_rows, n_out)
    with torch.inference_mode():
        got = rows.row_linear(lin, x)
        got_res = rows.row_linear(lin, x, residual)
        ref = F.linear(x, lin.weight, lin.bias)
    assert row_kernel_calls == [(n_rows, (n_out, n_in), False)] * 2
    tol = 1e-5 * float(ref.abs().max()) + 1e-6
    assert (got - ref).abs().max() <= tol
    assert (got_res - (ref + residual)).abs().max() <= tol + 1e-5 * float(residual.abs().max())


def test_activation_and_leading_dims(row_kernel_calls):
    lin = _linear(32, 48, activation="gelu")
    x = torch.randn(2, 1, 32)
    residual = torch.randn(2, 1, 48)
    with torch.inference_mode():
        got = rows.row_linear(lin, x, residual)
        ref = F.gelu(F.linear(x, lin.weight, lin.bias)) + residual
    assert got.shape == (2, 1, 48) and row_kernel_calls == [(2, (48, 32), False)]
    assert (got - ref).abs().max() <= 1e-5 * float(ref.abs().max())


@pytest.mark.parametrize("n_in", [384, 1536])
def test_int8_rows_are_weight_only(row_kernel_calls, n_in):
    """An int8 linear at a few rows: its int8 weights times their scales against the activations on a 16-bit grid
    of each row's absolute maximum, within that grid's rounding bound (fbgemm's dynamic GEMM rounds them to 8 bits)."""
    lin = _linear(n_in, 1536)
    fp32_weight = lin.weight.detach().clone()
    quantize_model_int8(torch.nn.Sequential(lin))
    x = torch.randn(rows.MAX_INT8_ROWS, n_in)
    x[3] = 0.0  # an all-zero row: exactly the bias
    with torch.no_grad():
        fbgemm = lin(x)
        with torch.inference_mode():
            got = rows.row_linear(lin, x)
    assert row_kernel_calls == [(rows.MAX_INT8_ROWS, (1536, n_in), True)]
    weight = (lin.weight.double() * lin.weight_scale.double()[:, None]).detach()
    dequantized = F.linear(x.double(), weight, lin.bias.double()).detach()
    # grid: the largest step int32 sums of n_in int16 x int8 products allow; half a step off per activation
    levels = min(32767, (2**31 - 1) // (127 * n_in))
    half_step = x.double().abs().amax(dim=1, keepdim=True) / (2 * levels)
    bound = half_step * weight.abs().sum(dim=1) + 1e-6 * dequantized.abs().max()
    assert ((got.double() - dequantized).abs() <= bound).all()
    assert torch.equal(got[3], lin.bias.detach())
    assert (got.double() - dequantized).abs().max() > 0  # the activations are rounded: not the float32 loop
    fp32 = F.linear(x, fp32_weight, lin.bias)
    assert (got - fp32).abs().max() < (fbgemm - fp32).abs().max()


def test_int8_rows_carry_non_finite_inputs_as_torch_does(row_kernel_calls):
    """A row holding inf or nan has no 16-bit grid: the call takes the float32 loop, whose outputs are non-finite
    (nan where torch has nan), not an integer conversion's garbage."""
    lin = _linear(64, 32)
    quantize_model_int8(torch.nn.Sequential(lin))
    x = torch.randn(2, 64)
    x[0, 5] = float("inf")
    x[1, 7] = float("nan")
    with torch.inference_mode():
        got = rows.row_linear(lin, x)
        ref = F.linear(x, lin.weight.float() * lin.weight_scale[:, None], lin.bias)
    assert row_kernel_calls == [(2, (32, 64), True)]
    assert not torch.isfinite(ref).any() and torch.isnan(ref[1]).all()
    assert not torch.isfinite(got).any() and torch.isnan(got[1]).all()


def test_reference_path_where_the_kernel_does_not_apply(row_kernel_calls, monkeypatch):
    lin = _linear(16, 8)
    x = torch.randn(rows.MAX_ROWS + 1, 16)
    with torch.inference_mode():
        many = rows.row_linear(lin, x)  # more rows than the kernel takes
        assert rows.row_product(x, lin.weight) is None
        assert rows.row_product(x[:1], lin.weight.t().contiguous().t()) is None  # not a contiguous (out, in) weight
        wide = _linear(16, 8).to(torch.float64)
        assert rows.row_linear(wide, x[:1].double()).dtype == torch.float64  # not float32: the module
    with torch.enable_grad():
        trained = rows.row_linear(lin, x[:1])  # autograd: the module, and a gradient
    assert trained.requires_grad
    monkeypatch.setenv("OASR_KERNELS", "0")
    with torch.inference_mode():
        off = rows.row_linear(lin, x[:1], torch.ones(1, 8))
    assert row_kernel_calls == []
    with torch.no_grad():
        assert torch.equal(many, lin(x))
        assert torch.equal(off, lin(x[:1]) + 1)


def test_row_product_takes_a_bare_weight(row_kernel_calls):
    weight, bias = torch.randn(10, 6), torch.randn(10)
    x = torch.randn(1, 1, 6)
    with torch.inference_mode():
        got = rows.row_product(x, weight, bias, max_rows=1)
    assert got.shape == (1, 1, 10) and row_kernel_calls == [(1, (10, 6), False)]
    ref = F.linear(x, weight, bias)
    assert (got - ref).abs().max() <= 1e-5 * float(ref.abs().max())
