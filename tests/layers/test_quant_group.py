"""One fbgemm GEMM for int8 linears sharing an input (oasr.layers.quant.int8_linear_group)."""

from __future__ import annotations

import torch

from oasr import layers
from oasr.layers.quant import int8_linear_group, quantize_model_int8


def _qkv(seed: int = 0) -> torch.nn.ModuleList:
    torch.manual_seed(seed)
    group = torch.nn.ModuleList([layers.Linear(48, 48), layers.Linear(48, 48, bias=False), layers.Linear(48, 32)])
    quantize_model_int8(group)
    return group


def test_group_equals_the_separate_calls():
    """The input is scaled and quantized once for all members, so the group's numbers are the separate
    calls' (int32 accumulation is exact): equal up to float rounding, on a batch with loud and quiet rows."""
    group = _qkv()
    x = torch.randn(2, 70, 48) * torch.logspace(-3, 2, 70)[None, :, None]
    with torch.no_grad():
        got = int8_linear_group(group, x)
        want = torch.cat([lin(x) for lin in group], dim=-1)
    assert got.shape == (2, 70, 128)
    assert bool(((got - want).abs() <= 1e-5 * want.abs().amax(dim=-1, keepdim=True)).all())


def test_group_follows_a_reload_and_a_bias_edit():
    group, other = _qkv(0), _qkv(1)
    x = torch.randn(10, 48)
    with torch.no_grad():
        int8_linear_group(group, x)  # packs the first weights
        group.load_state_dict(other.state_dict())
        got = int8_linear_group(group, x)
        want = torch.cat([lin(x) for lin in other], dim=-1)
        assert torch.allclose(got, want, atol=1e-5)
        group[0].bias.add_(1.0)
        moved = int8_linear_group(group, x)
    assert torch.allclose(moved[:, :48], got[:, :48] + 1.0, atol=1e-5)
    assert torch.allclose(moved[:, 48:], got[:, 48:], atol=1e-6)


def test_a_group_with_an_fp32_member_runs_each_linear():
    group = _qkv()
    fp32 = layers.Linear(48, 16)
    x = torch.randn(5, 48)
    with torch.no_grad():
        got = int8_linear_group((group[0], fp32), x)
        want = torch.cat([group[0](x), fp32(x)], dim=-1)
    assert torch.equal(got, want)
