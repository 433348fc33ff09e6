"""The FastConformer encoder's inference fast paths: packed GEMMs over whole 64-row blocks plus a 16-row-granular
tail (few oneDNN shapes, equal to ``F.linear``), residual adds as GEMM epilogues, and the relative-position
projection kept per layer (sliced for shorter inputs, recomputed after a weight change, off under grad)."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from oasr.layers import LinearActivation, packed
from oasr_models_hf.fastconformer import encoder as fc

from .conftest import run_encoder


@pytest.mark.parametrize("rows", [1, 15, 16, 37, 64, 100, 577, 1100])
def test_packed_gemm_blocks_and_tail_equal_linear(rows, monkeypatch):
    torch.manual_seed(rows)
    layer = fc.PackedLinearActivation(48, 96, "silu")
    x = torch.randn(rows, 48)
    seen = []
    true_linear = packed.linear

    def spy(module, block, *args, **kwargs):
        seen.append(block.shape[0])
        return true_linear(module, block, *args, **kwargs)

    monkeypatch.setattr(packed, "linear", spy)
    with torch.no_grad():
        out = fc.packed_gemm(layer, x)
    assert out is not None and out.shape == (rows, 96)
    ref = F.silu(x @ layer.weight.T + layer.bias)
    assert torch.allclose(out, ref, rtol=1e-5, atol=1e-5)
    # whole blocks are multiples of 64 rows (at most packed.BLOCK_ROWS), the tail a multiple of 16 under 64
    assert all(n % packed.MIN_ROWS == 0 and n <= packed.BLOCK_ROWS or n in (16, 32, 48) for n in seen), seen
    assert sum(seen) - rows < fc.TAIL_ROWS


def test_gemm_add_is_residual_plus_scaled_gemm():
    torch.manual_seed(1)
    layer = fc.PackedLinear(64, 32)
    x, residual = torch.randn(3, 37, 64), torch.randn(3, 37, 32)
    with torch.no_grad():
        fused = fc.gemm_add(layer, x, residual, 0.5)
    with torch.no_grad():
        ref = residual + 0.5 * (x @ layer.weight.T + layer.bias)
        unscaled = residual + x @ layer.weight.T + layer.bias
    assert torch.allclose(fused, ref, rtol=1e-5, atol=1e-5)
    assert float((fused - unscaled).abs().max()) > 1e-2  # the scale is applied
    plain = fc.gemm_add(layer, x, residual, 0.5)  # grad enabled: the reference ops
    assert plain.requires_grad and torch.allclose(plain, ref, rtol=1e-5, atol=1e-5)


def test_position_projection_is_kept_sliced_and_equals_recomputing(encoder, monkeypatch):
    torch.manual_seed(2)
    inputs = [(torch.randn(1, n, 16), torch.tensor([n])) for n in (700, 300, 1000, 90)]
    calls = []
    layer = encoder.layers[0].self_attn.relative_k_proj
    true_forward = type(layer).forward

    def counted(module, x):
        if module is layer:
            calls.append(x.shape[0])
        return true_forward(module, x)

    monkeypatch.setattr(type(layer), "forward", counted)
    cached = [run_encoder(encoder, f, n) for f, n in inputs]
    # 700 frames -> 88 after 8x: one table of +-127 projected once, reused for 38 and 125 frames; 12 frames reuse it
    assert calls == [255], calls
    monkeypatch.setattr(fc, "POSITION_CACHE_ELEMENTS", 0)  # every call projects its own 2T - 1 rows
    fresh = [run_encoder(encoder, f, n) for f, n in inputs]
    assert calls[1:] == [175, 75, 249, 23]
    for a, b in zip(cached, fresh, strict=True):
        assert float((a - b).abs().max() / b.abs().max()) < 1e-5
    monkeypatch.setattr(fc, "POSITION_CACHE_ELEMENTS", 1 << 20)
    with torch.no_grad():
        layer.weight.mul_(3.0)  # an in-place edit of the weight: the kept projection must not be served
    changed = run_encoder(encoder, *inputs[1])
    assert float((changed - cached[1]).abs().max()) > 1e-3
    monkeypatch.setattr(fc, "POSITION_CACHE_ELEMENTS", 0)
    assert torch.allclose(changed, run_encoder(encoder, *inputs[1]), rtol=1e-5, atol=1e-5)


def test_position_projection_is_recomputed_under_grad(encoder):
    attn = encoder.layers[0].self_attn
    table = fc.relative_positions(40, 32, torch.device("cpu"), torch.float32)
    with torch.no_grad():
        attn.position_keys(table)
    keys = attn.position_keys(table)
    assert keys.requires_grad  # a fresh projection that gradients flow through, not the kept one


def test_a_linear_activation_layer_keeps_its_activation_on_the_tail():
    layer = fc.PackedLinearActivation(16, 16, "relu")
    assert isinstance(layer, LinearActivation)
    with torch.no_grad():
        out = fc.packed_gemm(layer, torch.randn(5, 16))
    assert out is not None and float(out.min()) >= 0.0


def test_batched_subsampling_row_by_row_equals_the_masked_batch(encoder):
    torch.manual_seed(3)
    lens = torch.tensor([160, 97, 33, 1])
    feats = torch.randn(4, 160, 16)
    feats = feats + (torch.arange(160)[None, :, None] >= lens[:, None, None]) * 5.0  # junk padding
    sub = encoder.subsampling
    out_lens = sub.output_lengths(lens)
    with torch.no_grad():
        rows = sub(feats, lens)  # inference: each row over its own frames
    masked = sub(feats, lens).detach()  # grad enabled: the padded batch, masked after every convolution
    assert rows.shape == masked.shape == (4, int(sub.output_lengths(torch.tensor(160))), 32)
    for b, n in enumerate(out_lens.tolist()):
        assert torch.allclose(rows[b, :n], masked[b, :n], rtol=1e-5, atol=1e-5)
        with torch.no_grad():
            alone = sub(feats[b:b + 1, :int(lens[b])], lens[b:b + 1])[0]
        assert torch.allclose(rows[b, :n], alone, rtol=1e-5, atol=1e-6)
    with torch.no_grad():  # the junk is what a row would read without its own frames: it changes the output
        unmasked = sub(feats, None)
    assert float((unmasked[1, :int(out_lens[1])] - rows[1, :int(out_lens[1])]).abs().max()) > 1e-3
