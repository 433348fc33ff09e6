"""The waist LSTM's one-step CPU inference paths (one GEMM per layer over a row-major weight copy; ``embedded_step``'s
input-gate table for layer 0) equal torch's own LSTM: output and state, with and without a given state, one and two
layers, with and without biases, a batch; the derived copies follow weight changes; other calls keep torch's path."""

from __future__ import annotations

import pytest
import torch

from oasr.layers import LSTM, Embedding, derived


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


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("given_state", [False, True])
def test_embedded_step_equals_torch_lstm_over_the_looked_up_rows(layers, bias, given_state):
    """The input-gate table path (layer 0's W_ih · e + b looked up per id) equals torch's LSTM on embedding[ids]."""
    torch.manual_seed(layers + 2 * bias)
    ours = LSTM(12, 16, layers, bias=bias).eval()
    ref = torch.nn.LSTM(12, 16, layers, bias=bias, batch_first=True).eval()
    ref.load_state_dict(ours.state_dict())
    embedding = Embedding(20, 12)
    ids = torch.tensor([3, 19, 3])
    hx = (torch.randn(layers, 3, 16), torch.randn(layers, 3, 16)) if given_state else None
    with torch.no_grad():
        out, (h, c) = ours.embedded_step(ids, embedding, hx)
        assert "input_gates" in derived.kept(ours)  # the table path ran
        r_out, (r_h, r_c) = ref(embedding(ids)[:, None], hx)
    for a, b in ((out, r_out[:, 0]), (h, r_h), (c, r_c)):
        assert a.shape == b.shape
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)


def test_embedded_step_table_follows_weight_changes_and_is_skipped_where_it_would_not_pay():
    torch.manual_seed(5)
    ours = LSTM(12, 16, 2).eval()
    ref = torch.nn.LSTM(12, 16, 2, batch_first=True).eval()
    embedding = Embedding(20, 12)
    ids = torch.tensor([1, 7])
    hx = (torch.randn(2, 2, 16), torch.randn(2, 2, 16))

    def agree():
        for a, b in zip(ours.embedded_step(ids, embedding, hx)[1], ref(embedding(ids)[:, None], hx)[1], strict=True):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)

    with torch.no_grad():
        ours.embedded_step(ids, embedding, hx)  # builds the table from the first weights
        ours.load_state_dict(ref.state_dict())
        agree()
        embedding.weight.mul_(1.5)  # an in-place edit of the embedding alone
        agree()
        for name in ("weight_ih_l0", "bias_ih_l0", "bias_hh_l0"):  # and of each of layer 0's sources alone
            getattr(ours, name).mul_(1.5)
            getattr(ref, name).mul_(1.5)
            agree()
        derived.forget(ours)
        big = Embedding(2 * 12 + 1, 12)  # a table larger than TABLE_MAX_RATIO x W_ih: the module path
        for a, b in zip(ours.embedded_step(ids, big, hx)[1], ref(big(ids)[:, None], hx)[1], strict=True):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
        assert "input_gates" not in derived.kept(ours)
    out = ours.embedded_step(ids, embedding, hx)[0]  # autograd: torch's own LSTM, gradients flow
    assert out.requires_grad
