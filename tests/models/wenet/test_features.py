"""The FeatureSpec the converter emits reproduces WeNet's ``compute_fbank`` through oasr.features."""

from __future__ import annotations

import pytest
import torch

from oasr.features.config import FeatureConfig
from oasr.features.registry import build_extractor

from .conftest import CLIPS


@pytest.mark.parametrize("clip", CLIPS)
def test_kaldi_fbank_from_the_spec_equals_wenets(loaded, refs, clip):
    config = FeatureConfig.from_spec(loaded.feature_spec)
    extractor = build_extractor(config)
    ref = refs[clip]
    samples = ref["wav_int16"].float() / 32768 * config.audio_scale  # extractors take samples at the model's scale
    feats, lens = extractor(samples[None], torch.tensor([samples.numel()]))
    expected = ref["fbank"].double()
    assert lens.tolist() == [expected.size(0)]
    got = feats[0].double()
    assert got.shape == expected.shape
    # Energy-aware: float32 Kaldi implementations differ in the log of near-silent bins only, so compare
    # energies relative to each frame's loudest bin, and log values where a bin carries real energy.
    top = expected.max(dim=1, keepdim=True).values
    assert ((got.exp() - expected.exp()).abs() / top.exp()).max() < 1e-4
    loud = expected > top - 10.0
    assert (got - expected)[loud].abs().max() < 1e-3
