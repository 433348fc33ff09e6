"""The FastConformer encoder's inference fast paths: packed GEMMs as one MKL sgemm at the call's own row count
(``SGEMM``) or, without MKL, oneDNN's over whole 64-row blocks plus a 16-row-granular tail (few oneDNN shapes),
both equal to ``F.linear``; residual adds after / as the GEMM's epilogue, and the relative-position projection
kept per layer (sliced for shorter inputs, recomputed after a weight change, off under grad)."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from oasr.layers import LinearActivation, packed
from oasr.layers.derived import forget, kept
from oasr_models_hf.fastconformer import encoder as fc
from tests.models.hf.nemotron.conftest import stream_by_hand

from .conftest import run_encoder


def _packed_gemm_rows(rows, kernel, monkeypatch):
    """``packed_gemm`` of a (rows, 48) input through a 48 -> 96 SiLU layer, with the row counts it handed
    ``packed.<kernel>``: (output, reference, row counts)."""
    torch.manual_seed(rows)
    layer = fc.PackedLinearActivation(48, 96, "silu")
    x = torch.randn(rows, 48)
    seen = []
    true_kernel = getattr(packed, kernel)

    def spy(module, block, *args, **kwargs):
        seen.append(block.shape[0])
        return true_kernel(module, block, *args, **kwargs)

    monkeypatch.setattr(packed, kernel, spy)
    with torch.no_grad():
        out = fc.packed_gemm(layer, x)
    assert out is not None and out.shape == (rows, 96)
    return out, F.silu(x @ layer.weight.T + layer.bias), seen


@pytest.mark.parametrize("rows", [1, 15, 37, 100, 1100])
def test_packed_gemm_is_one_sgemm_at_the_own_row_count(rows, monkeypatch):
    if not fc.SGEMM:
        pytest.skip("torch built without MKL: the oneDNN blocks run (tested below)")
    out, ref, seen = _packed_gemm_rows(rows, "sgemm", monkeypatch)
    assert seen == [rows]  # one call, no padded rows
    assert torch.allclose(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 15, 16, 37, 64, 100, 577, 1100])
def test_packed_gemm_blocks_and_tail_equal_linear(rows, monkeypatch):
    monkeypatch.setattr(fc, "SGEMM", False)  # oneDNN's kernel: whole blocks and one tail
    out, ref, seen = _packed_gemm_rows(rows, "linear", monkeypatch)
    assert torch.allclose(out, ref, rtol=1e-5, atol=1e-5)
    # whole blocks are multiples of 64 rows (at most packed.BLOCK_ROWS), the tail a multiple of 16 under 64
    assert all(n % packed.MIN_ROWS == 0 and n <= packed.BLOCK_ROWS or n in (16, 32, 48) for n in seen), seen
    assert sum(seen) - rows < fc.TAIL_ROWS


@pytest.mark.parametrize("sgemm", [True, False])
def test_gemm_add_is_residual_plus_scaled_gemm(sgemm, monkeypatch):
    monkeypatch.setattr(fc, "SGEMM", sgemm and fc.SGEMM)
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


@pytest.mark.parametrize("frames", [1, 2, 9, 301, 800])
def test_packed_subsampling_equals_the_reference_ops(encoder, frames, monkeypatch):
    """The subsampling's channels-last oneDNN convolutions (reordered weights, ReLU epilogues) and the permuted
    ``linear`` equal the reference ops, alone and in a padded batch, are taken, and follow a weight change."""
    torch.manual_seed(frames)
    sub = encoder.subsampling

    def run(feats, lens):
        with torch.no_grad():
            return sub(feats, lens)

    feats = torch.randn(1, frames, 16)
    fast, ref = _fast_and_reference(lambda: run(feats, None), monkeypatch)
    fast_first = fast
    assert "packed_subsampling" in kept(sub)  # the packed path ran
    assert fast.shape == ref.shape == (1, int(sub.output_lengths(torch.tensor(frames))), 32)
    assert float((fast - ref).abs().max() / ref.abs().max()) < 1e-5
    batch, lens = torch.randn(3, frames + 40, 16), torch.tensor([frames + 40, frames, 1])
    for rows in (batch, lens), (batch[1:2], lens[1:2]):  # a padded batch, and one padded row
        fast, ref = _fast_and_reference(lambda: run(*rows), monkeypatch)  # noqa: B023
        assert fast.shape == ref.shape
        for b, n in enumerate(sub.output_lengths(rows[1]).tolist()):
            assert float((fast[b, :n] - ref[b, :n]).abs().max() / ref[b, :n].abs().max()) < 1e-5
    with torch.no_grad():
        sub.layers[2].weight.mul_(-1.5)  # the first depthwise-separable stage's depthwise conv, in place
        sub.linear.weight[:, :3].mul_(2.0)
    changed = run(feats, None)  # no forget(): the kept weights must notice the edit themselves
    with monkeypatch.context() as m:
        m.setenv("OASR_KERNELS", "0")
        ref = run(feats, None)
    assert float((changed - ref).abs().max() / ref.abs().max()) < 1e-5
    assert float((changed - fast_first).abs().max()) > 1e-3  # the new weights reached the packed path


def _randomize_norms(module) -> None:
    """Random BatchNorm statistics and norm affines, so a fold that ignored any of them would show."""
    with torch.no_grad():
        for m in module.modules():
            if hasattr(m, "running_var"):
                m.running_mean.normal_()
                m.running_var.uniform_(0.3, 3.0)
            if type(m).__name__ in ("BatchNorm1d", "LayerNorm") and getattr(m, "weight", None) is not None:
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0.0, 0.3)


def _depthwise_convs(encoder) -> list:
    return [layer.conv.depthwise_conv for layer in encoder.layers]


def _fast_and_reference(run, monkeypatch):
    forget()
    fast = run()
    with monkeypatch.context() as m:
        m.setenv("OASR_KERNELS", "0")
        ref = run()
    return fast, ref


@pytest.mark.parametrize("sgemm", [True, False])
def test_conv_module_depthwise_folded_channels_last_equals_reference(encoder, monkeypatch, sgemm):
    """The Parakeet conv module's depthwise conv (BatchNorm folded in, SiLU its epilogue) and its pointwise GLU
    (one sgemm and ``F.glu``, or oneDNN's two half GEMMs) equal the reference ops, are taken in every layer, and
    the depthwise conv is refolded after ``load_state_dict`` changes the statistics."""
    monkeypatch.setattr(fc, "SGEMM", sgemm and fc.SGEMM)
    glu = ("packed", "sgemm") if fc.SGEMM else ("packed", "glu")
    _randomize_norms(encoder)
    torch.manual_seed(5)
    feats, lens = torch.randn(2, 300, 16), torch.tensor([300, 170])
    out_lens = encoder.subsampling.output_lengths(lens).tolist()
    fast, ref = _fast_and_reference(lambda: run_encoder(encoder, feats, lens), monkeypatch)
    assert all("fold" in kept(conv) for conv in _depthwise_convs(encoder))  # the folded path was taken
    assert all(glu in kept(layer.conv.pointwise_conv1) for layer in encoder.layers)  # the packed GLU ran
    for b, n in enumerate(out_lens):
        assert float((fast[b, :n] - ref[b, :n]).abs().max() / ref[b, :n].abs().max()) < 1e-5
    state = {k: v.clone() for k, v in encoder.state_dict().items()}
    state["layers.0.conv.norm.running_var"].mul_(4.0)
    state["layers.1.conv.norm.running_mean"].add_(1.0)
    encoder.load_state_dict(state)
    after, ref_after = _fast_and_reference(lambda: run_encoder(encoder, feats, lens), monkeypatch)
    assert float((after - ref_after).abs().max() / ref_after.abs().max()) < 1e-5
    assert float((after - fast).abs().max()) > 1e-2  # the new statistics reached the fast path


def _nemotron_encoder():
    from oasr_models_hf.fastconformer.nemotron import NemotronAsrConfig
    from oasr_models_hf.fastconformer.nemotron_encoder import NemotronEncoder

    from .conftest import SMALL_ENCODER

    torch.manual_seed(4)
    config = NemotronAsrConfig(vocab_size=9, blank_id=8, sliding_window=9, num_lookahead_tokens=1, **SMALL_ENCODER)
    encoder = NemotronEncoder(config).eval()
    _randomize_norms(encoder)
    return encoder


def test_nemotron_causal_depthwise_offline_equals_reference(monkeypatch):
    """Nemotron's causal depthwise conv (left padding k - 1, a LayerNorm after it) on the channels-last path."""
    encoder = _nemotron_encoder()
    torch.manual_seed(6)
    feats, lens = torch.randn(2, 250, 16), torch.tensor([250, 131])
    out_lens = encoder.subsampling.output_lengths(lens).tolist()
    fast, ref = _fast_and_reference(lambda: run_encoder(encoder, feats, lens), monkeypatch)
    assert all("fold" in kept(conv) for conv in _depthwise_convs(encoder))
    for b, n in enumerate(out_lens):
        assert float((fast[b, :n] - ref[b, :n]).abs().max() / ref[b, :n].abs().max()) < 1e-5


def test_nemotron_streaming_conv_tail_on_the_channels_last_path(monkeypatch):
    """The chunk forward's depthwise conv over (cached k - 1 frames + the chunk) with no padding: every chunk
    equals the reference ops, the path is taken, and the chunks equal the offline encoder."""
    encoder = _nemotron_encoder()
    torch.manual_seed(7)
    feats = torch.randn(200, 16)
    chunk = 2 * encoder.attention_chunk

    def stream():
        return torch.cat(stream_by_hand(encoder, feats, chunk))

    fast, ref = _fast_and_reference(stream, monkeypatch)
    assert all("fold" in kept(conv) for conv in _depthwise_convs(encoder))
    assert fast.shape == ref.shape
    assert float((fast - ref).abs().max() / ref.abs().max()) < 1e-5
    offline = run_encoder(encoder, feats[None], torch.tensor([feats.shape[0]]))[0]
    assert float((fast - offline[:fast.shape[0]]).abs().max() / offline.abs().max()) < 1e-4
