"""LFR stacking and CMVN against FunASR's WavFrontend."""

from __future__ import annotations

import pytest
import torch
from funasr.frontends.wav_frontend import WavFrontend, apply_lfr

from oasr.features import FeatureConfig, apply_lfr_batch, extract_features_batch

pytestmark = pytest.mark.reference


@pytest.mark.parametrize("lfr_m, lfr_n", [(7, 6), (1, 1), (3, 1), (5, 3), (4, 2), (11, 7), (2, 5)])
def test_lfr_equals_funasr_apply_lfr(lfr_m, lfr_n):
    g = torch.Generator().manual_seed(lfr_m * 10 + lfr_n)
    lengths = [1, 2, 5, 6, 7, 13, 61, 100]
    feats = torch.randn(len(lengths), max(lengths), 8, generator=g)
    stacked, out_lens = apply_lfr_batch(feats, torch.tensor(lengths), lfr_m, lfr_n)
    for i, n in enumerate(lengths):
        ref = apply_lfr(feats[i, :n], lfr_m, lfr_n)
        assert int(out_lens[i]) == ref.shape[0]
        assert torch.equal(stacked[i, :ref.shape[0]], ref)
        assert not stacked[i, ref.shape[0]:].any()


def _write_am_mvn(path, shift: torch.Tensor, scale: torch.Tensor) -> None:
    def vector(v):
        return " ".join(f"{x:.6f}" for x in v.tolist())
    dim = shift.numel()
    path.write_text(f"<Nnet>\n<Splice> {dim} {dim}\n[ 0 ]\n<AddShift> {dim} {dim}\n"
                    f"<LearnRateCoef> 0 [ {vector(shift)} ]\n<Rescale> {dim} {dim}\n"
                    f"<LearnRateCoef> 0 [ {vector(scale)} ]\n</Nnet>\n")


def test_lfr_and_cmvn_equal_wavfrontend_on_the_same_features(signal, tmp_path):
    g = torch.Generator().manual_seed(0)
    shift = -10 - torch.rand(560, generator=g)
    scale = 0.1 + torch.rand(560, generator=g)
    _write_am_mvn(tmp_path / "am.mvn", shift, scale)
    frontend = WavFrontend(cmvn_file=str(tmp_path / "am.mvn"), lfr_m=7, lfr_n=6, dither=0.0)
    cfg = FeatureConfig(window_type="hamming", audio_scale=32768.0, lfr_m=7, lfr_n=6, normalize="cmvn",
                        options={"cmvn_mean": (-frontend.cmvn[0]).tolist(), "cmvn_istd": frontend.cmvn[1].tolist()})
    assert cfg.output_dim == 560
    rows = [signal(n, seed=n) for n in (16000, 9001, 30000)]
    feats, lens = extract_features_batch(rows, cfg)
    plain, plain_lens = extract_features_batch(rows, FeatureConfig(window_type="hamming", audio_scale=32768.0))
    ref, ref_lens = frontend.forward_lfr_cmvn(plain.clone(), plain_lens)
    assert lens.tolist() == ref_lens.tolist()
    torch.testing.assert_close(feats[:, :ref.shape[1]], ref, rtol=0, atol=0)


def test_whole_wavfrontend_pipeline(signal):
    frontend = WavFrontend(cmvn_file=None, lfr_m=7, lfr_n=6, dither=0.0)
    rows = [signal(n, seed=n) for n in (16000, 9001, 30000)]
    cfg = FeatureConfig(window_type="hamming", audio_scale=32768.0, lfr_m=7, lfr_n=6)
    ours, lens = extract_features_batch(rows, cfg)
    padded = torch.zeros(len(rows), max(r.numel() for r in rows))
    for i, r in enumerate(rows):
        padded[i, :r.numel()] = r
    ref, ref_lens = frontend(padded, torch.tensor([r.numel() for r in rows]))
    assert lens.tolist() == ref_lens.tolist()
    # energy-aware comparison per stacked 80-bin frame (see test_kaldi_parity)
    ours_blocks = ours[:, :ref.shape[1]].reshape(len(rows), ref.shape[1], 7, 80).double()
    ref_blocks = ref.reshape(len(rows), ref.shape[1], 7, 80).double()
    lin = ref_blocks.exp()
    tol = 2e-4 + 5e-5 * lin.sum(-1, keepdim=True) / lin
    valid = (torch.arange(ref.shape[1])[None, :] < ref_lens[:, None])[..., None, None]
    assert ((ours_blocks - ref_blocks).abs() <= tol)[valid.expand_as(tol)].all()
