"""The FastConformer encoders' prepacked oneDNN GEMMs (``pack_gemms``): every waist GEMM layer takes the packed
forward, the state-dict keys stay, the output equals the plain ``F.linear`` encoder, a reloaded weight is
repacked, and training (grad enabled) keeps the plain forward."""

from __future__ import annotations

import torch

from oasr.layers import Linear, LinearActivation, PointwiseConv1d, packed
from oasr.layers.derived import forget, kept
from oasr_models_hf.fastconformer import encoder as fc
from oasr_models_hf.fastconformer.encoder import FastConformerEncoder

from .conftest import run_encoder


def test_the_oneDNN_ops_exist_on_this_torch():
    assert torch.backends.mkldnn.is_available(), "torch lacks oneDNN: the encoders run plain F.linear"
    assert hasattr(torch.ops.mkldnn, "_linear_pointwise"), "torch lacks mkldnn._linear_pointwise"


def test_every_gemm_layer_is_packed_and_the_keys_stay(encoder):
    gemms = [m for m in encoder.modules() if isinstance(m, Linear | LinearActivation | PointwiseConv1d)]
    assert len(gemms) >= 2 * 9 and all(isinstance(m, fc._PackedGemm) for m in gemms)
    keys = set(encoder.state_dict())
    assert {"layers.0.feed_forward1.linear1.weight", "layers.1.self_attn.relative_k_proj.weight",
            "layers.0.conv.pointwise_conv1.weight", "subsampling.linear.bias"} <= keys
    run_encoder(encoder, torch.randn(1, 64, 16), torch.tensor([64]))
    assert set(encoder.state_dict()) == keys


def test_packed_output_equals_plain_linear(encoder, monkeypatch):
    feats, lens = torch.randn(2, 640, 16), torch.tensor([640, 477])  # > packed.MIN_ROWS frames after 8x
    forget()
    fast = run_encoder(encoder, feats, lens)
    assert any(kept(m) for m in encoder.modules())
    monkeypatch.setenv("OASR_KERNELS", "0")  # the reference path: plain F.linear
    plain = run_encoder(encoder, feats, lens)
    err = float((fast - plain).abs().max() / plain.abs().max())
    assert err < 1e-5, f"relative error {err:.2e}"


def test_a_reloaded_weight_is_repacked(encoder):
    feats, lens = torch.randn(1, 800, 16), torch.tensor([800])
    forget()
    before = run_encoder(encoder, feats, lens)
    state = {k: v.clone() for k, v in encoder.state_dict().items()}
    state["layers.0.feed_forward1.linear1.weight"].mul_(2.0)
    encoder.load_state_dict(state)
    after = run_encoder(encoder, feats, lens)
    assert kept(encoder.layers[0].feed_forward1.linear1)  # the packed path ran
    assert float((after - before).abs().max()) > 1e-3
    fresh = FastConformerEncoder(encoder.config).eval()
    fresh.load_state_dict(state)
    assert torch.allclose(after, run_encoder(fresh, feats, lens), rtol=1e-5, atol=1e-6)


def test_grad_enabled_keeps_the_plain_forward(encoder):
    layer = encoder.layers[0].feed_forward1.linear1
    x = torch.randn(packed.MIN_ROWS, 32)
    assert fc.packed_gemm(layer, x) is None  # grad is enabled here
    with torch.no_grad():
        out = fc.packed_gemm(layer, x)
    assert out is not None and torch.allclose(out, torch.nn.functional.silu(x @ layer.weight.T + layer.bias),
                                              rtol=1e-5, atol=1e-6)
