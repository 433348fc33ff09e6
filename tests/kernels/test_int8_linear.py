"""The ``int8_linear`` kernel (oasr-kernels) and its core seam :func:`oasr.layers.quant.int8_block`: with one plane
the function of fbgemm's dynamic int8 GEMM behind :class:`~oasr.layers.quant.Int8Weight` (the same grid, rounded in
another order), with two planes activations within half a step of a grid 254 times finer; the bias and the
residual in the epilogue; the reference path wherever it does not apply."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from oasr.layers import Linear, LinearActivation, _backend
from oasr.layers.quant import int8_block, int8_linear_group, quantize_model_int8
from tests.helpers import needs_vnni

# the kernel's GEMM is oneDNN's int8 product, fast where VNNI sums int8 in int32; without VNNI it is exact but ~5x
# slower than float32 (152 against 29 ms for 1500 x 384 -> 1536 on an AVX2 core), so ``int8_block`` declines there
# and these tests of the kernel's numbers run where it runs (``needs_vnni``)


def _int8(*linears):
    torch.manual_seed(0)
    for lin in linears:
        with torch.no_grad():
            lin.weight.normal_(0, 0.05)
            lin.bias.normal_(0, 0.1)
    quantize_model_int8(torch.nn.Sequential(*linears))
    return linears


def _activations(rows: int, width: int, seed: int = 1) -> torch.Tensor:
    """Rows at different scales with a few outlier channels, as a norm's or a GELU's outputs have."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, width, generator=gen) * torch.rand(rows, 1, generator=gen).mul(4).add(0.1)
    x[:, :3] *= 15
    return x


def _dequantized(lin: Linear) -> torch.Tensor:
    return lin.weight.double() * lin.weight_scale.double()[:, None]


def _rms(a: torch.Tensor) -> float:
    return float(a.detach().double().pow(2).mean().sqrt())


def test_kernel_is_registered():
    assert _backend.kernel("int8_linear") is not None


def test_declined_without_vnni(monkeypatch):
    """Without VNNI the block goes to fbgemm (None here), on every machine."""
    from oasr.layers import quant

    (lin,) = _int8(Linear(64, 32))
    monkeypatch.setattr(quant, "_vnni", lambda: False)
    with torch.inference_mode():
        assert int8_block((lin,), torch.randn(40, 64)) is None


@needs_vnni
def test_one_plane_is_fbgemms_function():
    """q/k/v as one block: as close to the exact product of the int8 weights as fbgemm's (its grid), and the two
    differ only where a value sits on a rounding boundary."""
    q, k, v = _int8(Linear(384, 384), Linear(384, 384), Linear(384, 384))
    x = _activations(200, 384)
    with torch.inference_mode():
        got = int8_block((q, k, v), x)
        fbgemm = int8_linear_group((q, k, v), x)
    exact = torch.cat([F.linear(x.double(), _dequantized(lin), lin.bias.double()) for lin in (q, k, v)], -1)
    assert got.shape == (200, 1152)
    err, ref_err = _rms(got - exact), _rms(fbgemm - exact)
    assert ref_err > 1e-4 * _rms(exact)  # the activations really are rounded: the comparison can fail
    assert 0.97 * ref_err < err < 1.03 * ref_err
    assert _rms(got - fbgemm) < 0.1 * ref_err


@needs_vnni
def test_residual_and_bias_in_the_epilogue_and_zero_rows():
    (lin,) = _int8(Linear(256, 128))
    x = _activations(64, 256)
    x[5] = 0.0  # an all-zero row: exactly the bias (+ residual)
    residual = torch.randn(64, 128)
    with torch.inference_mode():
        got = int8_block((lin,), x, residual=residual)
        plain = int8_block((lin,), x)
    assert torch.allclose(got, plain + residual, atol=1e-5)
    assert torch.allclose(got[5], lin.bias + residual[5], atol=1e-6)
    fbgemm = lin(x) + residual
    assert _rms(got - fbgemm) < 0.1 * _rms(fbgemm - F.linear(x, _dequantized(lin).float(), lin.bias) - residual)


@needs_vnni
def test_two_planes_are_within_half_a_fine_step():
    """Each activation within half a step of ``amax / 127 / 254`` of its row: the output error is bounded by that
    times the weights' absolute sums, and it is far below one plane's."""
    fc1, fc2 = _int8(LinearActivation(384, 1536, "gelu"), Linear(1536, 384))
    h = F.gelu(_activations(128, 1536, seed=3))
    with torch.inference_mode():
        two = int8_block((fc2,), h, planes=2)
        one = int8_block((fc2,), h, planes=1)
    weight = _dequantized(fc2)
    exact = F.linear(h.double(), weight, fc2.bias.double())
    half = h.double().abs().amax(dim=1, keepdim=True) / (127 * 254 * 2) * 1.01
    bound = half * weight.abs().sum(dim=1) + 1e-5 * exact.abs().max()
    assert bool(((two.double() - exact).abs() <= bound).all())
    assert _rms(two - exact) < 0.05 * _rms(one - exact)


@needs_vnni
def test_two_planes_quantize_a_float_linear_per_channel():
    """A float linear (Whisper's fc2 stays float in the layout) takes the kernel with two planes through an int8 copy
    of its weight made on first use (per output channel, as the int8 storage rounds), rebuilt when the weight
    changes; one plane needs int8 linears."""
    torch.manual_seed(2)
    lin = Linear(512, 256)
    h = _activations(96, 512)
    with torch.inference_mode():
        got = int8_block((lin,), h, planes=2)
        assert int8_block((lin,), h) is None
    twin = Linear(512, 256)
    twin.load_state_dict(lin.state_dict())
    quantize_model_int8(torch.nn.Sequential(twin))
    exact_int8 = F.linear(h.double(), _dequantized(twin), lin.bias.double())
    assert _rms(got - exact_int8) < 1e-3 * _rms(exact_int8)
    assert lin.weight.dtype == torch.float32 and lin._int8 is None
    with torch.no_grad():
        lin.weight.mul_(2)
    with torch.inference_mode():
        again = int8_block((lin,), h, planes=2)
    assert _rms(again - (2 * got - lin.bias)) < 1e-3 * _rms(again)


@needs_vnni
def test_reference_path_where_the_kernel_does_not_apply(monkeypatch):
    (lin,) = _int8(Linear(64, 32))
    x = torch.randn(40, 64)
    with torch.inference_mode():
        assert int8_block((lin,), x) is not None
        assert int8_block((lin,), x[:16]) is None  # torch._int_mm needs more than 16 rows
        assert int8_block((lin,), x.double()) is None
    with torch.enable_grad():
        assert int8_block((lin,), x) is None
    (odd,) = _int8(Linear(60, 32))
    with torch.inference_mode():
        assert int8_block((odd,), torch.randn(40, 60)) is None  # widths must be multiples of 8
        monkeypatch.setenv("OASR_KERNELS", "0")
        assert int8_block((lin,), x) is None


@needs_vnni
def test_gelu_is_torchs_exact_gelu_of_the_output():
    """fc1's GELU: torch's exact GELU of the kernel's output (an approximation flipped near-tie tokens); another
    activation, or GELU with two planes or a residual, is not offered."""
    (fc1,) = _int8(LinearActivation(384, 1536, "gelu"))
    x = _activations(64, 384, seed=4) * 3
    with torch.inference_mode():
        pre = int8_block((fc1,), x)
        got = int8_block((fc1,), x, activation="gelu")
        assert int8_block((fc1,), x, activation="relu") is None
        assert int8_block((fc1,), x, activation="gelu", planes=2) is None
        assert int8_block((fc1,), x, activation="gelu", residual=torch.zeros(64, 1536)) is None
    assert float(pre.min()) < -5 and float(pre.max()) > 5
    assert torch.equal(got, F.gelu(pre))
