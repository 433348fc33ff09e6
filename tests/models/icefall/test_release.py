"""Reading icefall release directories (``oasr_models_icefall.release``), shared by the icefall converters."""

from __future__ import annotations

import shutil

import pytest
import torch
from torch import nn

from oasr.errors import CheckpointFormatError
from oasr.features import FeatureConfig, build_extractor
from oasr_models_icefall import release

from . import _zipformer_helpers as zh
from .conftest import CLIPS, ZIPFORMER, clip_path, refs, release_dir


class _Params(dict):
    """Stands in for icefall's AttributeDict: a pickled class, which weights_only refuses."""


@pytest.fixture
def lang_only(fixtures_dir, tmp_path):
    """A release directory with the zipformer_ctc lang dir and an empty exp/."""
    shutil.copytree(release_dir(fixtures_dir, "zipformer_ctc") / "data", tmp_path / "data")
    (tmp_path / "exp").mkdir()
    return tmp_path


@pytest.mark.parametrize("name", ZIPFORMER)
def test_fixture_releases_read(fixtures_dir, name):
    directory = release_dir(fixtures_dir, name)
    assert release.is_release_dir(directory)
    assert release.checkpoint_file(directory) == directory / "exp" / "pretrained.pt"
    state = release.load_state_dict(directory)
    assert state and all(isinstance(v, torch.Tensor) for v in state.values())
    assert release.checkpoint_keys(directory) == frozenset(state)
    assert release.lang_dir(directory).name == "lang_bpe_500"


def test_not_a_release(tmp_path, lang_only):
    assert not release.is_release_dir(tmp_path / "nothing")
    assert not release.is_release_dir(lang_only)  # no weights yet
    (lang_only / "exp" / "pretrained.pt").write_bytes(b"")
    shutil.rmtree(lang_only / "data")
    assert not release.is_release_dir(lang_only)  # weights but no lang dir


def test_epoch_checkpoint_with_plain_tensors_loads(lang_only):
    state = {"w": torch.ones(2)}
    torch.save({"model": state, "optimizer": {"state": {}, "param_groups": [{"lr": 0.1}]}},
               lang_only / "exp" / "epoch-3.pt")
    torch.save({"model": {"w": torch.zeros(2)}}, lang_only / "exp" / "epoch-12.pt")
    assert release.checkpoint_file(lang_only).name == "epoch-12.pt"  # the latest epoch, not the last in text order
    assert torch.equal(release.load_state_dict(lang_only, "exp/epoch-3.pt")["w"], torch.ones(2))
    torch.save({"model": state}, lang_only / "exp" / "pretrained.pt")
    assert release.checkpoint_file(lang_only).name == "pretrained.pt"  # the export wins over epochs


def test_training_checkpoint_with_pickled_objects_is_refused(lang_only):
    torch.save({"model": {"w": torch.ones(2)}, "params": _Params(lr=1.0)}, lang_only / "exp" / "epoch-1.pt")
    with pytest.raises(CheckpointFormatError, match=r"epoch-1\.pt.*export\.py") as info:
        release.load_state_dict(lang_only)
    assert info.value.path == lang_only / "exp" / "epoch-1.pt"
    assert release.checkpoint_keys(lang_only) == frozenset()


def test_checkpoint_without_a_model_state_dict_is_refused(lang_only):
    torch.save({"state_dict": {"w": torch.ones(2)}}, lang_only / "exp" / "pretrained.pt")
    with pytest.raises(CheckpointFormatError, match=r"no 'model' state dict.*state_dict"):
        release.load_state_dict(lang_only)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_torchscript_is_refused_with_the_export_to_run(lang_only):
    scripted = torch.jit.script(nn.Linear(2, 2))
    scripted.save(str(lang_only / "exp" / "jit_script.pt"))
    with pytest.raises(CheckpointFormatError, match=r"jit_script\.pt.*without --jit.*pretrained\.pt"):
        release.load_state_dict(lang_only)
    shutil.copy(lang_only / "exp" / "jit_script.pt", lang_only / "exp" / "pretrained.pt")
    with pytest.raises(CheckpointFormatError, match=r"pretrained\.pt is a TorchScript module"):
        release.load_state_dict(lang_only)


def test_checkpoint_name_stays_inside_the_directory(lang_only):
    with pytest.raises(CheckpointFormatError, match="outside"):
        release.checkpoint_file(lang_only, "../elsewhere.pt")
    with pytest.raises(CheckpointFormatError, match="does not exist"):
        release.checkpoint_file(lang_only, "exp/epoch-99.pt")


def test_tokenizer_spec(fixtures_dir, lang_only):
    spec = release.tokenizer_spec(release_dir(fixtures_dir, "zipformer_ctc"), 500)
    assert spec.kind == "sentencepiece" and spec.files["model"].endswith("lang_bpe_500/bpe.model")
    assert spec.special_ids == (0, 1, 2)  # <blk>, <sos/eos>, <unk>
    tokens = release.token_ids(lang_only)
    assert (tokens["<blk>"], tokens["<sos/eos>"], tokens["<unk>"], tokens["#0"]) == (0, 1, 2, 500)
    with pytest.raises(CheckpointFormatError, match="500 pieces but the model outputs 501"):
        release.tokenizer_spec(lang_only, 501)
    shutil.rmtree(lang_only / "data")
    with pytest.raises(CheckpointFormatError, match="bpe.model"):
        release.lang_dir(lang_only)


def test_feature_spec_is_lhotses_fbank():
    spec = release.feature_spec()
    assert (spec.kind, spec.num_mel_bins, spec.audio_scale, spec.snip_edges, spec.high_freq, spec.dither) == (
        "kaldi_fbank", 80, 1.0, False, -400.0, 0.0)
    assert (spec.low_freq, spec.window_type, spec.frame_length_ms, spec.frame_shift_ms) == (20.0, "povey", 25.0, 10.0)


@pytest.mark.parametrize("name", ZIPFORMER)
def test_core_fbank_from_the_spec_equals_the_fixture_features(fixtures_dir, name):
    """core's kaldi_fbank under the release's FeatureSpec, from the wav, equals the fixture's lhotse
    fbank (energy-aware: float32 Kaldi implementations differ only in the log of near-silent bins)."""
    extractor = build_extractor(FeatureConfig.from_spec(release.feature_spec()))
    for clip in CLIPS:
        samples = zh.wave(clip_path(fixtures_dir, clip))
        feats, lens = extractor(samples[None], torch.tensor([samples.numel()]))
        expected = refs(fixtures_dir, name)[clip]["fbank"].double()
        assert lens.tolist() == [expected.shape[0]]
        got = feats[0].double()
        top = expected.max(dim=1, keepdim=True).values
        assert ((got.exp() - expected.exp()).abs() / top.exp()).max() < 1e-4, clip
        loud = expected > top - 10.0
        assert loud.float().mean() > 0.5
        assert (got - expected)[loud].abs().max() < 1e-3, clip
