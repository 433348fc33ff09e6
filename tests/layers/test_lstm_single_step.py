"""The waist LSTM's one-step CPU inference path (``torch.lstm_cell`` per layer) equals torch's own LSTM:
output and state, with and without a given state, one and two layers, a batch; other calls keep torch's path."""

from __future__ import annotations

import pytest
import torch

from oasr.layers import LSTM


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("given_state", [False, True])
def test_one_step_equals_torch_lstm(layers, given_state):
    torch.manual_seed(layers)
    ours = LSTM(12, 16, layers).eval()
    ref = torch.nn.LSTM(12, 16, layers, batch_first=True).eval()
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(3, 1, 12)
    hx = (torch.randn(layers, 3, 16), torch.randn(layers, 3, 16)) if given_state else None
    with torch.no_grad():
        assert ours._single_step(x)
        out, (h, c) = ours(x, hx)
        r_out, (r_h, r_c) = ref(x, hx)
    for a, b in ((out, r_out), (h, r_h), (c, r_c)):
        assert a.shape == b.shape
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    # a longer sequence, or grad enabled, keeps torch's own kernel
    assert not ours._single_step(torch.randn(3, 2, 12))
    assert not ours._single_step(x)


@pytest.mark.parametrize("bias", [True, False])
def test_one_step_follows_weight_changes(bias):
    """The one-step path's fused weight copy is re-derived after load_state_dict and in-place edits."""
    torch.manual_seed(3)
    ours = LSTM(12, 16, 2, bias=bias).eval()
    ref = torch.nn.LSTM(12, 16, 2, bias=bias, batch_first=True).eval()
    x = torch.randn(2, 1, 12)
    hx = (torch.randn(2, 2, 16), torch.randn(2, 2, 16))
    with torch.no_grad():
        ours(x, hx)  # derives the copy of the first weights
        ours.load_state_dict(ref.state_dict())
        for a, b in zip(ours(x, hx)[1], ref(x, hx)[1], strict=True):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
        ours.weight_hh_l1.mul_(2.0)
        ref.weight_hh_l1.mul_(2.0)
        for a, b in zip(ours(x, hx)[1], ref(x, hx)[1], strict=True):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
