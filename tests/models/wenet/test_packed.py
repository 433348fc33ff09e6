"""The oneDNN-prepacked GEMM path of the Conformer (oasr.layers.packed) against the reference ops.

The packed path must compute what the plain torch ops compute up to float rounding, must actually be
taken where it applies (CPU fp32 inference), must follow weight changes, must stay off under autograd
and for int8 linears, and must show oneDNN only a bounded set of GEMM shapes.
"""

from __future__ import annotations

import pytest
import torch

from oasr.layers import packed
from oasr.layers.derived import forget, kept, owners
from oasr.layers.quant import quantize_model_int8
from oasr_models_wenet.model import ConformerModel

from ._helpers import assert_rel, small_conformer

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


def _model(**overrides) -> ConformerModel:
    return small_conformer(5, **overrides)


def _packs() -> dict:
    """Every module holding packed GEMM weights → the names of its packs."""
    packs = {m: [name for name in kept(m) if name[0] == "packed"] for m in owners()}
    return {m: names for m, names in packs.items() if names}


def _batch():
    gen = torch.Generator().manual_seed(2)
    lens = torch.tensor([900, 700, 430])  # 3 x 224 encoder frames: 672 rows, two row blocks, the last padded
    return torch.randn(3, 900, 24, generator=gen), lens


def _reference(model, feats, lens, monkeypatch):
    with monkeypatch.context() as m:
        m.setenv("OASR_KERNELS", "0")
        with torch.inference_mode():
            return model.forward_offline(feats, lens)


@pytest.mark.parametrize("overrides", [{}, {"activation_type": "relu", "macaron_style": False},
                                       {"cnn_module_norm": "batch_norm", "causal": False}])
def test_packed_forward_equals_the_reference_ops(overrides, monkeypatch):
    model = _model(**overrides)
    feats, lens = _batch()
    forget()
    with torch.inference_mode():
        fast, fast_lens = model.forward_offline(feats, lens)
    taken = sum(len(names) for names in _packs().values())
    # q/k/v as one group, pos, out, two FFNs (4 linears), two pointwise convs per layer; embed and CTC head
    per_layer = 1 + 1 + 1 + (4 if model.config.encoder.macaron_style else 2) + 2
    assert taken == 2 * per_layer + 2
    ref, ref_lens = _reference(model, feats, lens, monkeypatch)
    assert torch.equal(fast_lens, ref_lens)
    for row, n in enumerate(ref_lens.tolist()):
        assert_rel(fast[row, :n].exp(), ref[row, :n].exp(), 1e-4)
    assert not torch.equal(fast, ref)  # a different GEMM: rounding differs, so the comparison above is not vacuous


def test_a_weight_change_repacks(monkeypatch):
    model = _model()
    feats, lens = _batch()
    with torch.inference_mode():
        before = model.forward_offline(feats, lens)[0]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["encoder.encoders.0.feed_forward.w_1.weight"].mul_(-1.5)
    state["encoder.encoders.1.self_attn.linear_k.weight"].normal_()
    model.load_state_dict(state)
    with torch.inference_mode():
        after = model.forward_offline(feats, lens)[0]
    ref = _reference(model, feats, lens, monkeypatch)[0]
    assert (after - before).abs().max() > 1e-2
    assert_rel(after.exp(), ref.exp(), 1e-4)


def test_autograd_and_int8_take_the_reference_path(monkeypatch):
    model = _model()
    feats, lens = _batch()
    with torch.no_grad():
        ref = _reference(model, feats, lens, monkeypatch)[0]
    with torch.enable_grad():
        graded = model.forward_offline(feats, lens)[0]
    assert torch.equal(graded.detach(), ref)
    quantize_model_int8(model)
    int8_ref = _reference(model, feats, lens, monkeypatch)[0]
    forget()
    with torch.inference_mode():
        int8 = model.forward_offline(feats, lens)[0]
    # only what int8 leaves at fp32 is packed: the subsampling projection and CTC head, and per layer
    # the attention output projection and the two pointwise convolutions
    packs = _packs()
    assert all(getattr(m, "_int8", None) is None for m in packs)
    assert {type(m).__name__ for m in packs} == {"Linear", "CtcProjection", "PointwiseConv1d"}
    assert len(packs) == 2 + 2 * 3
    for row, n in enumerate(lens.tolist()):
        n = int(model.encoder.embed.output_lengths(torch.tensor(n)))
        # a float-rounding difference upstream can move an activation across an int8 grid step
        assert_rel(int8[row, :n].exp(), int8_ref[row, :n].exp(), 1e-2)


def test_blocked_sees_a_bounded_set_of_row_counts():
    seen = set()

    def rowwise(x, r):
        seen.add(x.size(0))
        return x * 2 + r

    with torch.inference_mode():
        for rows in (64, 65, 300, 511, 512, 513, 1500, 2047, 3001):
            x, r = torch.randn(rows, 8), torch.randn(rows, 8)
            assert torch.equal(packed.blocked(rowwise, x.view(1, rows, 8), r.view(1, rows, 8))[0], x * 2 + r)
    assert seen <= set(range(packed.MIN_ROWS, packed.BLOCK_ROWS + 1, packed.MIN_ROWS))
    with torch.inference_mode():
        small = torch.randn(5, 8)
        assert torch.equal(packed.blocked(rowwise, small, small), small * 3)
    assert 5 in seen  # below MIN_ROWS: one call on the tensor as given
