"""Whisper on the prepacked GEMM path (oasr.layers.packed): the same function as the reference ops and as
transformers, taken where it should be (encoder, cross-attention K/V, decoder steps of more rows than the row kernel takes) and
not where it should not (int8 linears, steps of a few rows: the fused layer kernel or the row kernel, OASR_KERNELS=0)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from oasr.layers import Conv1d, Linear, packed, rows

TOKENS = [[50258, 50259, 50359, 50363, 100, 2000, 300, 7], [50258, 50259, 50359, 50363, 5, 60, 700, 8000]]


@pytest.fixture(scope="module")
def mel():
    torch.manual_seed(3)
    return torch.randn(2, 80, 3000)


@pytest.fixture
def packed_calls(monkeypatch):
    """The linears each call of the packed GEMM path ran (one tuple per call)."""
    calls: list[tuple[torch.nn.Module, ...]] = []
    real = packed._packed

    def spy(linears, scale):
        calls.append(tuple(linears))
        return real(linears, scale)

    monkeypatch.setattr(packed, "_packed", spy)
    return calls


def _close(got: torch.Tensor, ref: torch.Tensor, rel: float = 1e-4) -> None:
    assert (got - ref).abs().max() <= rel * ref.abs().max()


def test_encoder_packed_equals_reference_and_transformers(tiny, hf_model, mel, packed_calls, monkeypatch):
    encoder = tiny.model.encoder
    with torch.no_grad():
        ref = hf_model.model.encoder(mel).last_hidden_state
        fast = encoder(mel.transpose(1, 2))
        taken = set(packed_calls)
        monkeypatch.setenv("OASR_KERNELS", "0")
        plain = encoder(mel.transpose(1, 2))
    layer = encoder.layers[0]
    sa = layer.self_attn
    assert (sa.q_proj, sa.k_proj, sa.v_proj) in taken and (sa.out_proj,) in taken
    assert (layer.fc1,) in taken and (layer.fc2,) in taken
    _close(fast, ref)
    _close(plain, ref)
    _close(fast, plain)


def test_encoder_under_autograd_takes_the_reference_path(tiny, mel, packed_calls):
    feats = mel[:1].transpose(1, 2).clone().requires_grad_(True)
    out = tiny.model.encoder(feats)
    out.sum().backward()
    assert packed_calls == []
    assert feats.grad is not None and torch.isfinite(feats.grad).all()


def test_conv1d_gelu_fused_equals_the_convolution_then_gelu():
    torch.manual_seed(0)
    conv1, conv2 = Conv1d(80, 48, 3, padding=1), Conv1d(48, 48, 3, stride=2, padding=1)
    x = torch.randn(2, 80, 301)
    with torch.no_grad():
        for conv, inp in ((conv1, x), (conv2, F.gelu(conv1.forward_bct(x)))):
            ref = F.gelu(conv.forward_bct(inp))
            got = packed.conv1d(conv, inp, "gelu")
            assert got.shape == ref.shape
            _close(got, ref, 1e-5)
        causal = Conv1d(80, 48, 3, padding=(2, 0))  # unequal padding: the reference convolution
        torch.testing.assert_close(packed.conv1d(causal, x, "relu"), F.relu(causal.forward_bct(x)), rtol=0, atol=0)


def test_blocked_few_rows_pad_to_powers_of_two_and_full_blocks_stay_whole():
    torch.manual_seed(0)
    lin = Linear(16, 24)
    shapes: list[int] = []

    def fn(rows: torch.Tensor) -> torch.Tensor:
        shapes.append(rows.shape[0])
        return packed.linear(lin, rows, "gelu", min_rows=1)

    with torch.no_grad():
        for n in (1, 3, 5, 17, 40):
            x = torch.randn(n, 16)
            _close(packed.blocked(fn, x, few=True), F.gelu(lin(x)), 1e-5)
        assert shapes == [1, 4, 8, 32, 64]
        shapes.clear()
        x = torch.randn(3, 100, 16)
        _close(packed.blocked(fn, x, block_rows=100), F.gelu(lin(x)), 1e-5)
        assert shapes == [100, 100, 100]
        shapes.clear()
        packed.blocked(fn, torch.randn(5, 16))  # few rows without few=True: fn on the rows as given
        assert shapes == [5]


def test_cross_kv_packed_equals_the_projections(tiny, packed_calls):
    decoder = tiny.model.decoder
    torch.manual_seed(1)
    enc = torch.randn(2, 1500, decoder.embed_tokens.weight.shape[1])
    with torch.no_grad():
        ks, vs = decoder.cross_kv(enc)
        attn = decoder.layers[0].encoder_attn
        assert (attn.k_proj, attn.v_proj) in packed_calls
        k_ref = attn.project(enc, 1).transpose(-1, -2)
        v_ref = attn.project(enc, 2)
    _close(ks[0], k_ref)
    _close(vs[0], v_ref)
    assert ks[0].is_contiguous() and vs[0].is_contiguous()


def test_cross_kv_int8_is_one_group_gemm_per_window_and_equals_the_projections(tiny, monkeypatch):
    """int8 k/v run as one int8 group GEMM per window (k and v together), with the per-linear int8 projections'
    numbers, written into the transposed-key and value layouts; a window's K/V do not depend on its batch mates."""
    from oasr.layers.quant import quantize_model_int8
    from oasr_models_hf.whisper import model as whisper_model

    model = copy.deepcopy(tiny.model)
    quantize_model_int8(model, model.quantization_layout())
    decoder = model.decoder
    groups: list[tuple[int, tuple[torch.nn.Module, ...]]] = []
    real = whisper_model.int8_linear_group

    def spy(linears, x):
        groups.append((x.shape[0], tuple(linears)))
        return real(linears, x)

    monkeypatch.setattr(whisper_model, "int8_linear_group", spy)
    torch.manual_seed(2)
    enc = torch.randn(3, 1500, decoder.embed_tokens.weight.shape[1])
    with torch.no_grad():
        ks, vs = decoder.cross_kv(enc)
        alone_k, alone_v = decoder.cross_kv(enc[1:2])
        attn = decoder.layers[0].encoder_attn
        assert attn.k_proj._int8 is not None and attn.v_proj._int8 is not None
        assert groups.count((1500, (attn.k_proj, attn.v_proj))) == 3 + 1  # one per window
        k_ref = attn.project(enc, 1).transpose(-1, -2)
        v_ref = attn.project(enc, 2)
    _close(ks[0], k_ref, 1e-6)
    _close(vs[0], v_ref, 1e-6)
    assert all(k.is_contiguous() and v.is_contiguous() for k, v in zip(ks, vs, strict=True))
    assert all(torch.equal(k[1:2], a) and torch.equal(v[1:2], b)
               for k, v, a, b in zip(ks, vs, alone_k, alone_v, strict=True))


@pytest.mark.parametrize("path", ["fused layer", "row kernel", "packed"])
def test_decoder_steps_fused_row_kernel_or_packed_equal_transformers(tiny, hf_model, mel, packed_calls, row_kernel_calls,
                                                                     fused_step_calls, monkeypatch, path):
    """Teacher-forced one step at a time over 2 rows and 1 row against transformers.  Steps of up to
    ``rows.MAX_ROWS`` rows run each layer as one ``decoder_layer_rows`` kernel call ("fused layer"); without that
    kernel their step linears take the row kernel ("row kernel"); more rows take the packed GEMMs ("packed": 2 rows
    with the row kernel capped at 1, and the fused kernel off).  The vocabulary projection takes the row kernel up to
    8 rows in every case."""
    from oasr.layers import _backend

    if path != "fused layer":
        monkeypatch.setitem(_backend._cache, "decoder_layer_rows", None)
    row_kernel_max = 1 if path == "packed" else rows.MAX_ROWS
    monkeypatch.setattr(rows, "MAX_ROWS", row_kernel_max)
    model = tiny.model
    layers = len(model.decoder.layers)
    tokens = torch.tensor(TOKENS)
    d, ffn = model.decoder.layers[0].fc1.in_features, model.decoder.layers[0].fc1.out_features
    with torch.no_grad():
        ref = hf_model(input_features=mel, decoder_input_ids=tokens).logits
        enc, _ = model.encode_offline(mel.transpose(1, 2))
        for n in (2, 1):
            state, hidden = model.decoder.prefill(enc[:n], tokens[:n, :3])
            steps = [model.decoder.logits(hidden[:, -1])]
            for j in range(3, tokens.shape[1] - 1):
                if j == 4:
                    packed_calls.clear()
                    row_kernel_calls.clear()
                    fused_step_calls.clear()
                steps.append(model.decoder.step(state, tokens[:n, j]))
            fc1 = model.decoder.layers[0].fc1
            few = n <= row_kernel_max
            fused, kernel_rows = few and path == "fused layer", few and path != "fused layer"
            row_calls = [shape for _, shape, _ in row_kernel_calls]
            timed = tokens.shape[1] - 5
            assert ((fc1,) in packed_calls) == (not few)
            assert fused_step_calls == [n] * (timed * layers if fused else 0)
            # per step and layer: stacked q/k/v, out, cross q, cross out, fc1, fc2; per step the vocabulary
            # projection (up to 8 rows: in every case)
            assert ({(3 * d, d), (d, d), (ffn, d), (d, ffn)} <= set(row_calls)) == kernel_rows
            assert row_calls.count(tuple(model.decoder.proj_out.weight.shape)) == timed
            assert len(row_calls) == timed * (1 + 6 * layers * kernel_rows)
            _close(torch.stack(steps, 1), ref[:n, 2:-1])
        monkeypatch.setenv("OASR_KERNELS", "0")
        packed_calls.clear()
        fused_step_calls.clear()
        state, _ = model.decoder.prefill(enc, tokens[:, :3])
        model.decoder.step(state, tokens[:, 3])
        state, _ = model.decoder.prefill(enc[:1], tokens[:1, :3])
        model.decoder.step(state, tokens[:1, 3])
        assert packed_calls == [] and fused_step_calls == []


def test_int8_linears_keep_their_path(tiny, mel, packed_calls):
    from oasr.layers.quant import quantize_model_int8

    model = copy.deepcopy(tiny.model)
    quantize_model_int8(model, model.quantization_layout())
    int8 = {m for m in model.modules() if getattr(m, "_int8", None) is not None}
    assert int8, "the layout quantizes some linears"
    tokens = torch.tensor(TOKENS)
    with torch.no_grad():
        enc, _ = model.encode_offline(mel.transpose(1, 2))
        state, _ = model.decoder.prefill(enc, tokens[:, :4])
        model.decoder.step(state, tokens[:, 4])
    packed_modules = {m for call in packed_calls for m in call}
    assert not packed_modules & int8
    layer = model.encoder.layers[0]
    assert layer.fc1 in int8 and layer.fc1 not in packed_modules
