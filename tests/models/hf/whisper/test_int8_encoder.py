"""The int8 Whisper encoder layer on its fused path (q/k/v as one fbgemm GEMM per window, int8 outputs
taking their GELU / residual in place, the fp32 fc2 on the packed waist): the same function as the
reference int8 ops within int8 noise, no further from fp32 than they are, a window's numbers
independent of its batch mates, and the reference ops wherever the fast path must not run."""

from __future__ import annotations

import copy

import pytest
import torch

from oasr.layers import packed
from oasr.layers.quant import quantize_model_int8
from oasr_models_hf.whisper import encoder as whisper_encoder


@pytest.fixture(scope="module")
def mel():
    torch.manual_seed(5)
    return torch.randn(2, 3000, 80)  # two full 30 s windows


@pytest.fixture(scope="module")
def int8_model(tiny):
    model = copy.deepcopy(tiny.model)
    quantize_model_int8(model, model.quantization_layout())
    return model


@pytest.fixture
def calls(monkeypatch):
    """The int8 group GEMMs and the packed fp32 linears the encoder ran."""
    seen: dict[str, list] = {"int8_group": [], "packed": []}
    real_group, real_packed = whisper_encoder.int8_linear_group, packed._packed

    def group_spy(linears, x):
        seen["int8_group"].append(tuple(linears))
        return real_group(linears, x)

    def packed_spy(linears, scale):
        seen["packed"].append(tuple(linears))
        return real_packed(linears, scale)

    monkeypatch.setattr(whisper_encoder, "int8_linear_group", group_spy)
    monkeypatch.setattr(packed, "_packed", packed_spy)
    return seen


def test_int8_encoder_fused_path_matches_the_reference_int8_ops(tiny, int8_model, mel, calls, monkeypatch):
    encoder = int8_model.encoder
    layer = encoder.layers[0]
    sa = layer.self_attn
    assert all(m._int8 is not None for m in (sa.q_proj, sa.k_proj, sa.v_proj, sa.out_proj, layer.fc1))
    assert layer.fc2._int8 is None  # the shipped layout keeps fc2 at fp32
    with torch.no_grad():
        fp32 = tiny.model.encoder(mel)
        fast = encoder(mel)
        monkeypatch.setenv("OASR_KERNELS", "0")
        plain = encoder(mel)
    assert (sa.q_proj, sa.k_proj, sa.v_proj) in calls["int8_group"]
    assert (layer.fc2,) in calls["packed"]
    int8_modules = {m for m in encoder.modules() if getattr(m, "_int8", None) is not None}
    assert not {m for call in calls["packed"] for m in call} & int8_modules

    def rms(a: torch.Tensor) -> float:
        return float(a.pow(2).mean().sqrt())

    noise = rms(plain - fp32)
    assert noise > 1e-4 * rms(fp32)  # int8 really rounds: the comparison below can fail
    assert rms(fast - fp32) <= 1.1 * noise  # no further from fp32 than the reference int8 ops
    assert rms(fast - plain) <= noise  # the two int8 paths differ within the int8 noise


def test_a_window_rounds_independently_of_its_batch_mates(int8_model, mel):
    """One GEMM block per full window: the activation grid is the window's own, so a window's encoder
    output is the same alone and next to another (unlike one block over the whole batch)."""
    loud = mel.clone()
    loud[1] *= 50.0
    with torch.no_grad():
        alone = int8_model.encoder(mel[:1])
        batched = int8_model.encoder(loud)
    assert torch.allclose(batched[:1], alone, rtol=0, atol=1e-5 * float(alone.abs().max()))


def test_int8_encoder_under_autograd_takes_the_reference_path(int8_model, mel, calls):
    feats = mel[:1].clone().requires_grad_(True)
    out = int8_model.encoder(feats)
    assert out.requires_grad and calls["int8_group"] == [] and calls["packed"] == []
