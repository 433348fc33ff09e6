"""The FastConformer encoders' prepacked oneDNN GEMMs (``pack_gemms``): every waist GEMM layer takes the packed
forward, the state-dict keys stay, the output equals the plain ``F.linear`` encoder, a reloaded weight is
repacked, and training (grad enabled) keeps the plain forward."""

from __future__ import annotations

import pytest
import torch

from oasr.layers import Linear, LinearActivation, PointwiseConv1d
from oasr_models_hf.fastconformer import encoder as fc
from oasr_models_hf.fastconformer.config import FastConformerConfig
from oasr_models_hf.fastconformer.encoder import FastConformerEncoder

SHAPE = dict(num_mel_bins=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
             conv_kernel_size=9, subsampling_conv_channels=8)


@pytest.fixture()
def encoder():
    torch.manual_seed(0)
    return FastConformerEncoder(FastConformerConfig(vocab_size=9, blank_id=8, **SHAPE)).eval()


def _run(encoder, feats, lens):
    with torch.no_grad():
        return encoder(feats, lens)[0]


def test_the_oneDNN_ops_exist_on_this_torch():
    assert fc._ONEDNN_LINEAR is not None, "torch lacks mkldnn._linear_pointwise: the encoders run plain F.linear"


def test_every_gemm_layer_is_packed_and_the_keys_stay(encoder):
    gemms = [m for m in encoder.modules() if isinstance(m, Linear | LinearActivation | PointwiseConv1d)]
    assert len(gemms) >= 2 * 9 and all(isinstance(m, fc._PackedGemm) for m in gemms)
    keys = set(encoder.state_dict())
    assert {"layers.0.feed_forward1.linear1.weight", "layers.1.self_attn.relative_k_proj.weight",
            "layers.0.conv.pointwise_conv1.weight", "subsampling.linear.bias"} <= keys
    _run(encoder, torch.randn(1, 64, 16), torch.tensor([64]))
    assert set(encoder.state_dict()) == keys


def test_packed_output_equals_plain_linear(encoder, monkeypatch):
    feats, lens = torch.randn(2, 120, 16), torch.tensor([120, 77])
    packed = _run(encoder, feats, lens)
    assert any("_onednn_packed" in m.__dict__ for m in encoder.modules())
    monkeypatch.setattr(fc, "_ONEDNN_LINEAR", None)
    plain = _run(encoder, feats, lens)
    err = float((packed - plain).abs().max() / plain.abs().max())
    assert err < 1e-5, f"relative error {err:.2e}"


def test_a_reloaded_weight_is_repacked(encoder):
    feats, lens = torch.randn(1, 96, 16), torch.tensor([96])
    before = _run(encoder, feats, lens)
    state = {k: v.clone() for k, v in encoder.state_dict().items()}
    state["layers.0.feed_forward1.linear1.weight"].mul_(2.0)
    encoder.load_state_dict(state)
    after = _run(encoder, feats, lens)
    assert float((after - before).abs().max()) > 1e-3
    fresh = FastConformerEncoder(encoder.config).eval()
    fresh.load_state_dict(state)
    assert torch.allclose(after, _run(fresh, feats, lens), rtol=1e-5, atol=1e-6)


def test_grad_enabled_keeps_the_plain_forward(encoder):
    layer = encoder.layers[0].feed_forward1.linear1
    x = torch.randn(3, 32)
    assert fc.packed_gemm(layer, x) is None  # grad is enabled here
    with torch.no_grad():
        out = fc.packed_gemm(layer, x)
    assert out is not None and torch.allclose(out, torch.nn.functional.silu(x @ layer.weight.T + layer.bias),
                                              rtol=1e-5, atol=1e-6)
