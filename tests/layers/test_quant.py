"""int8 weights for the waist's linears (oasr.layers.quant)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from oasr import layers
from oasr.errors import CheckpointFormatError
from oasr.layers.quant import SCHEME, is_quantized, prepare_quantized, quantize_model_int8
from oasr.models.specs import QuantLayout


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = layers.Embedding(50, 32)
        self.up = layers.LinearActivation(32, 64, "gelu")
        self.down = layers.Linear(64, 32)
        self.keep = layers.Linear(32, 32)
        self.head = layers.Linear(32, 50, bias=False)
        self.head.weight = self.embed.weight  # tied, as Whisper's output projection

    def forward(self, ids):
        x = self.embed(ids)
        x = self.keep(x + self.down(self.up(x)))
        return self.head(x)


@pytest.fixture
def model():
    torch.manual_seed(0)
    return Tiny().eval()


def test_storage_is_int8_per_output_channel(model):
    weight = model.down.weight.detach().clone()
    section = quantize_model_int8(model, QuantLayout(keep_full_precision=("keep",)))
    assert section["scheme"] == SCHEME and sorted(section["layers"]) == ["down", "head", "up"]
    assert model.down.weight.dtype == torch.int8 and model.down.weight_scale.shape == (32,)
    assert torch.allclose(model.down.weight_scale, weight.abs().amax(dim=1) / 127)
    restored = model.down.weight.float() * model.down.weight_scale[:, None]
    assert bool(((restored - weight).abs() <= model.down.weight_scale[:, None] / 2 + 1e-7).all())
    assert model.keep.weight.dtype == torch.float32 and model.keep._int8 is None
    # the tied projection got its own int8 copy; the embedding table stays floating point
    assert model.embed.weight.dtype == torch.float32 and model.head.weight.dtype == torch.int8
    assert is_quantized(model)


def test_outputs_stay_close_to_float(model):
    ids = torch.randint(0, 50, (4, 7))
    with torch.no_grad():
        ref = model(ids)
        quantize_model_int8(model)
        got = model(ids)
    assert got.shape == ref.shape
    assert (got - ref).abs().max() <= 0.05 * ref.abs().max()
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() > 0.9


def test_int8_gemm_equals_dequantized_weights_up_to_activation_rounding(model):
    """The fbgemm path computes with the stored int8 weights: it matches x @ dequant(W).T within the
    8-bit rounding of x alone."""
    quantize_model_int8(model)
    lin = model.down
    x = torch.randn(5, 64)
    with torch.no_grad():
        got = lin(x)
        weight = lin.weight.float() * lin.weight_scale[:, None]
        exact = torch.nn.functional.linear(x, weight, lin.bias)
        step = (x.max() - x.min()) / 255  # per-tensor uint8 activation step
        bound = step / 2 * weight.abs().sum(dim=1).max() + 1e-4
    assert (got - exact).abs().max() <= bound


def test_a_quantized_state_dict_loads_into_a_prepared_model(model):
    ids = torch.randint(0, 50, (2, 5))
    section = quantize_model_int8(model)
    with torch.no_grad():
        want = model(ids)
    state = model.state_dict()
    torch.manual_seed(1)
    fresh = Tiny().eval()
    prepare_quantized(fresh, section)
    with torch.no_grad():
        fresh(ids)  # packs the placeholder weights: the load below must replace them
    fresh.load_state_dict(state)
    with torch.no_grad():
        assert torch.equal(fresh(ids), want)


def test_bad_quantization_sections_are_refused(model):
    with pytest.raises(CheckpointFormatError, match="scheme"):
        prepare_quantized(model, {"scheme": "fp4", "layers": []})
    with pytest.raises(CheckpointFormatError, match="embed"):
        prepare_quantized(model, {"scheme": SCHEME, "layers": ["embed"]})


def test_read_bf16_marks_kept_linears_and_round_trips_through_the_section(model):
    """A layout's ``read_bf16`` names (of its kept linears) are marked for bfloat16 reads, listed in the section and
    marked again by prepare_quantized; the weights themselves stay float32, and so does the module's forward."""
    weight = model.keep.weight.detach().clone()
    section = quantize_model_int8(model, QuantLayout(keep_full_precision=("keep", "down"), read_bf16=("keep",)))
    assert section["read_bf16"] == ["keep"] and "keep" not in section["layers"]
    assert model.keep.read_bf16 and not model.down.read_bf16 and not model.up.read_bf16
    assert model.keep.weight.dtype == torch.float32 and torch.equal(model.keep.weight, weight)
    x = torch.randn(3, 32)
    with torch.no_grad():
        assert torch.equal(model.keep(x), torch.nn.functional.linear(x, weight, model.keep.bias))
    fresh = Tiny().eval()
    prepare_quantized(fresh, section)
    assert fresh.keep.read_bf16 and not fresh.down.read_bf16
    assert "read_bf16" not in quantize_model_int8(Tiny().eval(), QuantLayout(keep_full_precision=("keep",)))
    with pytest.raises(CheckpointFormatError, match="'up'.*bfloat16"):
        prepare_quantized(Tiny().eval(), {"scheme": SCHEME, "layers": ["up"], "read_bf16": ["up"]})
    with pytest.raises(CheckpointFormatError, match="'embed'"):
        prepare_quantized(Tiny().eval(), {"scheme": SCHEME, "layers": [], "read_bf16": ["embed"]})


def test_activation_scales_are_per_row(model):
    """A quiet row next to a loud one keeps its own 8-bit resolution (a per-tensor scale would round the
    quiet row to a few levels): each row's error stays within its own rounding bound."""
    quantize_model_int8(model)
    lin = model.down
    torch.manual_seed(3)
    x = torch.randn(4, 64) * torch.tensor([[1e-3], [1.0], [300.0], [0.02]])
    with torch.no_grad():
        got = lin(x)
        weight = lin.weight.float() * lin.weight_scale[:, None]
        exact = torch.nn.functional.linear(x, weight, lin.bias)
        # fbgemm's asymmetric uint8 grid over a row scaled into [-1, 1]: a step of at most 2/255 of max|x_row|
        step = 2 * x.abs().amax(dim=1, keepdim=True) / 255
        bound = step / 2 * weight.abs().sum(dim=1)[None, :] + 1e-5
    assert bool(((got - exact).abs() <= bound).all())
    assert lin._int8.reduce_range is (not torch.cpu._is_vnni_supported())  # 8 bits wherever VNNI allows




def test_a_single_row_keeps_its_own_grid_and_follows_bias_changes(model):
    """One row goes to fbgemm unscaled with the bias packed beside the weight: it still rounds on its own
    grid (within its own bound, however quiet), agrees with the same row computed inside a batch up to
    that rounding, and an in-place change of the bias is honoured."""
    quantize_model_int8(model)
    lin = model.down
    torch.manual_seed(4)
    x = torch.randn(3, 64) * torch.tensor([[1e-3], [1.0], [300.0]])
    with torch.no_grad():
        weight = lin.weight.float() * lin.weight_scale[:, None]
        exact = torch.nn.functional.linear(x, weight, lin.bias)
        bound = (2 * x.abs().amax(dim=1, keepdim=True) / 255) / 2 * weight.abs().sum(dim=1)[None, :] + 1e-5
        alone = torch.cat([lin(row[None]) for row in x])
        batched = lin(x)
        assert bool(((alone - exact).abs() <= bound).all())
        assert bool(((alone - batched).abs() <= 2 * bound).all())
        before = lin(x[1:2])
        lin.bias.add_(1.0)
        assert torch.allclose(lin(x[1:2]), before + 1.0, atol=1e-5)
        three_d = lin(x[1:2].reshape(1, 1, 64))
    assert three_d.shape == (1, 1, 32) and torch.allclose(three_d[0], before + 1.0, atol=1e-5)


def test_bf16_linear_is_the_dequantized_linear_at_bfloat16(model):
    """``bf16_linear``: the int8 weights dequantized (a float linear's as stored), everything rounded to bfloat16, the
    bias and an exact GELU in the epilogue; a cat of several linears; rebuilt when a weight changes."""
    from oasr.layers.quant import bf16_linear

    quantize_model_int8(model, QuantLayout(keep_full_precision=("keep",)))
    torch.manual_seed(1)
    x = torch.randn(70, 32)
    xb = x.to(torch.bfloat16)
    up = model.up
    dequant = up.weight.float() * up.weight_scale[:, None]
    ref = torch.nn.functional.gelu(xb.double() @ dequant.to(torch.bfloat16).double().t() + up.bias.double())
    with torch.no_grad():
        out = bf16_linear((up,), xb, "gelu")
        assert out.dtype == torch.bfloat16 and out.shape == (70, 64)
        assert (out.double() - ref).abs().max() <= 2 ** -7 * ref.abs().max()  # bfloat16 output rounding
        both = bf16_linear((model.keep, model.keep), xb)
        single = xb.double() @ model.keep.weight.to(torch.bfloat16).double().t() + model.keep.bias.double()
        assert (both.double() - torch.cat([single, single], -1)).abs().max() <= 2 ** -7 * single.abs().max()
        model.keep.weight.mul_(2.0)
        assert (bf16_linear((model.keep,), xb).double() - 2 * single + model.keep.bias.double()).abs().max() \
            <= 2 ** -6 * single.abs().max()
