"""The int8 Whisper encoder layer on its fused path (q/k/v as one fbgemm GEMM per window, int8 outputs taking their
GELU / residual in place, or with ``int8_kernel_linears`` the three on the ``int8_linear`` kernel; the fp32 fc2 on
the packed waist): the same function as the reference int8 ops within int8 noise, no further from fp32 than they
are, a window's numbers independent of its batch mates, and the reference ops wherever the fast path must not run."""

from __future__ import annotations

import copy

import pytest
import torch

from oasr.layers import packed
from oasr.layers.quant import quantize_model_int8
from oasr_models_hf.whisper import encoder as whisper_encoder
from tests.helpers import needs_vnni


@pytest.fixture(autouse=True)
def int8_paths(monkeypatch):
    """The int8 paths these tests check, on every CPU: an AMX CPU's layers run at bfloat16 instead (``int8_amx``),
    which the tests at the end of this module switch on themselves."""
    monkeypatch.setattr(whisper_encoder.WhisperEncoderLayer, "int8_amx", False)


def _rms(a: torch.Tensor) -> float:
    return float(a.pow(2).mean().sqrt())


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
    """The int8 group GEMMs (fbgemm), the ``int8_linear`` kernel's blocks (linears, planes) and the packed fp32 linears
    the encoder ran."""
    seen: dict[str, list] = {"int8_group": [], "int8_block": [], "packed": []}
    real_group, real_block, real_packed = whisper_encoder.int8_linear_group, whisper_encoder.int8_block, packed._packed

    def group_spy(linears, x):
        seen["int8_group"].append(tuple(linears))
        return real_group(linears, x)

    def block_spy(linears, x, residual=None, planes=1, activation="none"):
        out = real_block(linears, x, residual=residual, planes=planes, activation=activation)
        if out is not None:
            seen["int8_block"].append((tuple(linears), planes))
        return out

    def packed_spy(linears, scale):
        seen["packed"].append(tuple(linears))
        return real_packed(linears, scale)

    monkeypatch.setattr(whisper_encoder, "int8_linear_group", group_spy)
    monkeypatch.setattr(whisper_encoder, "int8_block", block_spy)
    monkeypatch.setattr(packed, "_packed", packed_spy)
    return seen


def test_int8_encoder_fused_path_matches_the_reference_int8_ops(tiny, int8_model, mel, calls, monkeypatch):
    """The fused linears against the reference ops, both on the float32 attention core (the int8 core: below)."""
    monkeypatch.setattr(whisper_encoder.WhisperEncoderLayer, "int8_attention", False)
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
    assert (sa.q_proj, sa.k_proj, sa.v_proj) in calls["int8_group"] and not calls["int8_block"]
    assert (layer.fc2,) in calls["packed"]
    int8_modules = {m for m in encoder.modules() if getattr(m, "_int8", None) is not None}
    assert not {m for call in calls["packed"] for m in call} & int8_modules

    noise = _rms(plain - fp32)
    assert noise > 1e-4 * _rms(fp32)  # int8 really rounds: the comparison below can fail
    assert _rms(fast - fp32) <= 1.1 * noise  # no further from fp32 than the reference int8 ops
    assert _rms(fast - plain) <= noise  # the two int8 paths differ within the int8 noise


@needs_vnni
def test_kernel_linears_run_the_same_function(tiny, int8_model, mel, calls, monkeypatch):
    """``int8_kernel_linears`` on: q/k/v, out_proj and fc1 on the ``int8_linear`` kernel (fbgemm's activation grid,
    rounded in another order), the output within the int8 noise of fbgemm's and no further from fp32; the slot
    empty, fbgemm again."""
    from oasr.layers import _backend

    encoder = int8_model.encoder
    sa, fc1 = encoder.layers[0].self_attn, encoder.layers[0].fc1
    with torch.no_grad():
        fp32 = tiny.model.encoder(mel)
        fbgemm_out = encoder(mel)
        assert calls["int8_group"] and not calls["int8_block"]
        monkeypatch.setattr(whisper_encoder.WhisperEncoderLayer, "int8_kernel_linears", True)
        calls["int8_group"].clear()
        kernel_out = encoder(mel)
        assert not calls["int8_group"]
        assert {((sa.q_proj, sa.k_proj, sa.v_proj), 1), ((sa.out_proj,), 1), ((fc1,), 1)} <= set(calls["int8_block"])
        monkeypatch.setitem(_backend._cache, "int8_linear", None)
        assert torch.equal(encoder(mel), fbgemm_out)
    assert (sa.q_proj, sa.k_proj, sa.v_proj) in calls["int8_group"]
    noise = _rms(fbgemm_out - fp32)
    assert noise > 1e-4 * _rms(fp32)
    assert _rms(kernel_out - fp32) <= 1.1 * noise
    assert 0 < _rms(kernel_out - fbgemm_out) <= noise


@needs_vnni
def test_int8_fc2_runs_two_planes_within_the_int8_noise(tiny, int8_model, mel, calls, monkeypatch):
    """``int8_fc2`` on: each layer's float fc2 takes the kernel with two-plane activations (its weights quantized per
    output channel on first use), and the output stays within the int8 noise of the default."""
    encoder = int8_model.encoder
    with torch.no_grad():
        fp32 = tiny.model.encoder(mel)
        default = encoder(mel)
        monkeypatch.setattr(whisper_encoder.WhisperEncoderLayer, "int8_fc2", True)
        calls["int8_block"].clear()
        both = encoder(mel)
    assert {c[0] for c in calls["int8_block"] if c[1] == 2} == {(layer.fc2,) for layer in encoder.layers}
    assert all(layer.fc2._int8 is None for layer in encoder.layers)  # the model's fc2 stays float
    noise = _rms(default - fp32)
    assert 0 < _rms(both - default) <= noise
    assert _rms(both - fp32) <= 1.25 * noise


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
    assert out.requires_grad and calls["int8_group"] == [] and calls["int8_block"] == [] and calls["packed"] == []


def _counting_core(monkeypatch) -> list:
    """Replace the ``int8_attention`` slot by a wrapper that records each call's q shape and runs the int8 scheme on
    every CPU (the slot itself runs SDPA where the int8 products are slow, without VNNI)."""
    from oasr.layers import _backend

    real = _backend.kernel("int8_attention")
    assert real is not None, "oasr-kernels registers the int8 attention core"
    seen: list = []

    def counting(q, k, v, scale):
        seen.append(tuple(q.shape))
        return real(q, k, v, scale, int8=True)

    monkeypatch.setitem(_backend._cache, "int8_attention", counting)
    return seen


def test_int8_layers_take_the_int8_attention_core(tiny, int8_model, mel, monkeypatch):
    """By default each int8 layer's attention core is the kernel's (one call per layer over the whole batch); its
    rounding adds less than the int8 linears' own noise; False on the class, or OASR_KERNELS=0, is SDPA again."""
    seen = _counting_core(monkeypatch)
    encoder = int8_model.encoder
    cfg = tiny.model.config
    with torch.no_grad():
        fp32 = tiny.model.encoder(mel)
        on = encoder(mel)
        assert seen == [(2, 1500, cfg.encoder_attention_heads, cfg.d_model // cfg.encoder_attention_heads)] * len(
            encoder.layers)
        seen.clear()
        monkeypatch.setattr(whisper_encoder.WhisperEncoderLayer, "int8_attention", False)
        off = encoder(mel)
        assert not seen
    assert 0 < _rms(on - off) < _rms(off - fp32)


def test_int8_attention_core_on_trained_tiny_en_speech(tiny_en, tiny_en_strategy, beckett, monkeypatch):
    """On real speech through the trained tiny.en (int8 model): what the int8 core changes in the encoder output is
    less than what the int8 linears already change (measured 0.023 against 0.031 rms; with the weights rounded
    each on its own instead of diffused: 0.057)."""
    loaded, _ = tiny_en
    model = copy.deepcopy(loaded.model)
    quantize_model_int8(model, model.quantization_layout())
    seen = _counting_core(monkeypatch)
    with torch.no_grad():
        wave = beckett if isinstance(beckett, torch.Tensor) else torch.as_tensor(beckett)
        mel = tiny_en_strategy.log_mels([wave])[0][:, : model.config.input_frames].t()[None]
        fp32 = loaded.model.encoder(mel)
        on = model.encoder(mel)
        monkeypatch.setattr(whisper_encoder.WhisperEncoderLayer, "int8_attention", False)
        off = model.encoder(mel)
    assert len(seen) == len(model.encoder.layers)
    assert 0 < _rms(on - off) < _rms(off - fp32)


def _bf16_spy(monkeypatch) -> list:
    """Switch the bfloat16 layers on as on an AMX CPU (emulated elsewhere: slower, the same numbers up to oneDNN's
    summation order) and record the linears each bfloat16 GEMM ran."""
    seen: list = []
    real = whisper_encoder.bf16_linear

    def spy(linears, x, activation="none"):
        seen.append((tuple(linears), x.dtype, activation))
        return real(linears, x, activation)

    monkeypatch.setattr(whisper_encoder.WhisperEncoderLayer, "int8_amx", True)
    monkeypatch.setattr(whisper_encoder, "amx", lambda: True)
    monkeypatch.setattr(whisper_encoder, "bf16_linear", spy)
    return seen


def test_amx_layers_run_at_bfloat16_nearer_fp32_than_int8(tiny, int8_model, mel, calls, monkeypatch):
    """With AMX an int8 layer runs every linear at bfloat16 (q/k/v as one GEMM, fc1 with its GELU, fc2 on fc1's
    bfloat16 output) and no int8 GEMM; its output is nearer float32's than the int8 path's, and a window's numbers
    do not depend on its batch mates.  Without AMX (``amx()`` False) the int8 path runs."""
    encoder = int8_model.encoder
    with torch.no_grad():
        fp32 = tiny.model.encoder(mel)
        int8 = encoder(mel)
        assert calls["int8_group"]
        calls["int8_group"].clear()
        seen = _bf16_spy(monkeypatch)
        bf16 = encoder(mel)
        batch_calls = list(seen)
        alone = encoder(mel[1:])
    assert not calls["int8_group"] and not calls["int8_block"]
    expected = []
    for layer in encoder.layers:
        sa = layer.self_attn
        expected += [((sa.q_proj, sa.k_proj, sa.v_proj), torch.bfloat16, "none"), ((sa.out_proj,), torch.bfloat16,
                     "none"), ((layer.fc1,), torch.bfloat16, "gelu"), ((layer.fc2,), torch.bfloat16, "none")]
    assert set(batch_calls) == set(expected) and len(batch_calls) == len(mel) * len(expected)  # a block per window
    assert bf16.dtype == torch.float32
    noise = _rms(int8 - fp32)
    assert 0 < _rms(bf16 - fp32) < noise
    assert torch.allclose(bf16[1:], alone, rtol=0, atol=1e-5 * float(alone.abs().max()))


def test_amx_layers_on_trained_tiny_en_speech(tiny_en, tiny_en_strategy, beckett, monkeypatch):
    """On real speech through the trained tiny.en (int8 model): the bfloat16 layers change the encoder output less
    than the int8 path does."""
    loaded, _ = tiny_en
    model = copy.deepcopy(loaded.model)
    quantize_model_int8(model, model.quantization_layout())
    with torch.no_grad():
        wave = beckett if isinstance(beckett, torch.Tensor) else torch.as_tensor(beckett)
        mel = tiny_en_strategy.log_mels([wave])[0][:, : model.config.input_frames].t()[None]
        fp32 = loaded.model.encoder(mel)
        int8 = model.encoder(mel)
        seen = _bf16_spy(monkeypatch)
        bf16 = model.encoder(mel)
    assert len(seen) == 4 * len(model.encoder.layers) and all(dtype == torch.bfloat16 for _, dtype, _ in seen)
    assert 0 < _rms(bf16 - fp32) < _rms(int8 - fp32)
