"""Core's channels-last depthwise convolution (``oasr.layers.packed.depthwise_norm_activation``) against the
waist's reference ops: ``activation(norm(conv(y)))`` for a folded batch norm or a layer norm after it, symmetric,
causal and caller-given padding; the fold is taken and rebuilt after a weight or statistics change."""

from __future__ import annotations

import pytest
import torch

from oasr.layers import BatchNorm1d, DepthwiseConv1d, Gelu, LayerNorm, Relu, Swish, packed
from oasr.layers.derived import forget, kept

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")

C, K = 24, 7


def _modules(norm_kind: str, padding, bias: bool = True, seed: int = 0):
    torch.manual_seed(seed)
    conv = DepthwiseConv1d(C, K, padding=padding, bias=bias)
    if norm_kind == "batch":
        norm = BatchNorm1d(C)
        with torch.no_grad():
            norm.weight.uniform_(0.5, 2.0)
            norm.bias.normal_()
            norm.running_mean.normal_()
            norm.running_var.uniform_(0.2, 3.0)
    else:
        norm = LayerNorm(C)
        with torch.no_grad():
            norm.weight.uniform_(0.5, 2.0)
            norm.bias.normal_()
    return conv, norm


def _reference(conv, norm, activation, y, padding=None):
    if padding is not None:
        y = torch.nn.functional.pad(y.transpose(1, 2), padding)
        out = torch.nn.functional.conv1d(y, conv.weight, conv.bias, groups=conv.groups).transpose(1, 2)
    else:
        out = conv(y)
    return activation(norm(out))


def _rel(a, b) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("norm_kind", ["batch", "layer"])
@pytest.mark.parametrize("padding", [(3, 3), (6, 0), (0, 6), (2, 4)])
@pytest.mark.parametrize("activation", [Swish(), Relu(), Gelu()], ids=["swish", "relu", "gelu"])
def test_equals_the_reference_ops(norm_kind, padding, activation):
    conv, norm = _modules(norm_kind, padding, bias=padding != (2, 4))
    y = torch.randn(3, 41, C)
    forget()
    with torch.inference_mode():
        fast = packed.depthwise_norm_activation(conv, norm, activation, y)
    ref = _reference(conv, norm, activation, y).detach()
    assert fast.shape == ref.shape
    assert _rel(fast, ref) < 1e-5
    assert "fold" in kept(conv)  # the oneDNN path was taken


@pytest.mark.parametrize("norm_kind", ["batch", "layer"])
def test_caller_padding_reads_its_own_left_context(norm_kind):
    """A streaming chunk: the input carries k - 1 frames of left context, so padding (0, 0) gives len - (k - 1)."""
    conv, norm = _modules(norm_kind, (K - 1, 0))
    y = torch.randn(2, 7 + K - 1, C)
    forget()
    with torch.inference_mode():
        fast = packed.depthwise_norm_activation(conv, norm, Swish(), y, (0, 0))
    assert "fold" in kept(conv)
    ref = _reference(conv, norm, Swish(), y, (0, 0)).detach()
    assert fast.shape == (2, 7, C) and _rel(fast, ref) < 1e-5
    # the same frames as the module's own causal padding over the joined input, last 7 outputs
    assert _rel(fast, _reference(conv, norm, Swish(), y)[:, K - 1:].detach()) < 1e-5
    plain = packed.depthwise_norm_activation(conv, norm, Swish(), y, (0, 0))  # grad enabled: reference ops
    assert plain.requires_grad and _rel(plain.detach(), ref) < 1e-5


def test_fold_follows_a_weight_and_statistics_change():
    conv, norm = _modules("batch", (3, 3))
    y = torch.randn(2, 30, C)
    forget()
    with torch.inference_mode():
        before = packed.depthwise_norm_activation(conv, norm, Swish(), y)
    state = {k: v.clone() for k, v in {**conv.state_dict(), **{"n." + k: v for k, v in norm.state_dict().items()}}
             .items()}
    norm.load_state_dict({k[2:]: v * (3.0 if k == "n.running_var" else 1.0)
                          for k, v in state.items() if k.startswith("n.")})
    with torch.inference_mode():
        after = packed.depthwise_norm_activation(conv, norm, Swish(), y)
    assert _rel(after, _reference(conv, norm, Swish(), y).detach()) < 1e-5
    assert float((after - before).abs().max()) > 1e-2
    with torch.no_grad():
        conv.weight.mul_(-1.5)  # in place: the fold must not be served
    with torch.inference_mode():
        edited = packed.depthwise_norm_activation(conv, norm, Swish(), y)
    assert _rel(edited, _reference(conv, norm, Swish(), y).detach()) < 1e-5
    assert float((edited - after).abs().max()) > 1e-2


def test_kernels_off_runs_the_reference(monkeypatch):
    conv, norm = _modules("batch", (3, 3))
    y = torch.randn(2, 30, C)
    monkeypatch.setenv("OASR_KERNELS", "0")
    forget()
    with torch.inference_mode():
        out = packed.depthwise_norm_activation(conv, norm, Swish(), y)
    assert "fold" not in kept(conv)
    assert torch.equal(out, _reference(conv, norm, Swish(), y).detach())
