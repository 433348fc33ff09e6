"""The Conformer's CPU fp32 inference paths beyond the packed GEMMs, against the reference ops.

Each path (the prepacked channels-last subsampling, the depthwise convolution with a folded batch
norm, the feed-forwards' 1024-row blocks) must compute what the reference ops compute
(``OASR_KERNELS=0``) up to float rounding, must actually be taken, and must follow a weight change.
"""

from __future__ import annotations

import pytest
import torch

from oasr.layers.derived import forget, kept
from oasr_models_wenet import cpu as enc
from oasr_models_wenet.model import ConformerModel

from ._helpers import assert_rel, small_conformer

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


def _model(**overrides) -> ConformerModel:
    return small_conformer(7, random_norm_stats=True, **overrides)


def _batch(rows: int = 3):
    gen = torch.Generator().manual_seed(3)
    lens = torch.tensor([900, 700, 430, 900, 610][:rows])
    return torch.randn(rows, 900, 24, generator=gen), lens


def _compare(model, feats, lens, monkeypatch) -> torch.Tensor:
    """The fast forward, checked against the reference ops on every valid frame."""
    with torch.inference_mode():
        fast, fast_lens = model.forward_offline(feats, lens)
    with monkeypatch.context() as m:
        m.setenv("OASR_KERNELS", "0")
        with torch.inference_mode():
            ref, ref_lens = model.forward_offline(feats, lens)
    assert torch.equal(fast_lens, ref_lens)
    for row, n in enumerate(ref_lens.tolist()):
        assert_rel(fast[row, :n].exp(), ref[row, :n].exp(), 1e-4)
    assert not torch.equal(fast, ref)  # other kernels round differently: the comparison is not vacuous
    return fast


@pytest.mark.parametrize("causal", [False, True])
def test_batch_norm_folded_into_the_depthwise_conv(causal, monkeypatch):
    model = _model(cnn_module_norm="batch_norm", causal=causal)
    feats, lens = _batch()
    forget()
    before = _compare(model, feats, lens, monkeypatch)
    modules = [layer.conv_module.depthwise_conv for layer in model.encoder.encoders]
    assert all("fold" in kept(m) for m in modules)  # the folded path (core's) was taken
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["encoder.encoders.0.conv_module.norm.running_var"].mul_(3.0)
    state["encoder.encoders.1.conv_module.norm.running_mean"].add_(1.0)
    model.load_state_dict(state)
    after = _compare(model, feats, lens, monkeypatch)  # refolded on the new statistics
    assert (after - before).abs().max() > 1e-2


@pytest.mark.parametrize("kind", ["conv2d", "conv2d6", "conv2d8"])
def test_prepacked_subsampling_equals_the_reference(kind, monkeypatch):
    model = _model(input_layer=kind)
    feats, lens = _batch()
    forget()
    before = _compare(model, feats, lens, monkeypatch)
    assert "subsampling" in kept(model.encoder.embed)  # the prepacked path was taken
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["encoder.embed.conv.2.weight"].mul_(-1.3)
    state["encoder.embed.out.bias"].add_(0.5)
    model.load_state_dict(state)
    after = _compare(model, feats, lens, monkeypatch)  # re-derived from the new weights
    assert (after - before).abs().max() > 1e-2


def test_prepacked_subsampling_tiles_and_batch_one(monkeypatch):
    """One row of many frames runs over several tiles; every tile's frames match the reference."""
    model = _model()
    feats = torch.randn(1, 4 * enc.PACKED_TILE_ROWS + 37, 24)
    lens = torch.tensor([feats.size(1)])
    with torch.inference_mode():
        fast = model.encoder.embed(feats)
    with monkeypatch.context() as m:
        m.setenv("OASR_KERNELS", "0")
        with torch.inference_mode():
            ref = model.encoder.embed(feats)
    assert fast.size(1) > 4 * enc.PACKED_TILE_ROWS // 4 - 1
    assert_rel(fast, ref, 1e-4)
    _compare(model, feats, lens, monkeypatch)


def test_feed_forward_row_blocks_cover_every_row(monkeypatch):
    """5 rows x 224 frames = 1120 rows: one 1024-row block and a padded one, against the reference."""
    model = _model()
    feats, lens = _batch(rows=5)
    frames = int(model.encoder.embed.output_lengths(torch.tensor(feats.size(1))))
    assert enc.FFN_BLOCK_ROWS < 5 * frames < 2 * enc.FFN_BLOCK_ROWS
    _compare(model, feats, lens, monkeypatch)
