"""icefall ``conformer_ctc3`` (``icefall_conformer``) against the fixture made by icefall's own code.

From audio through the public engine API: features, encoder output (1e-4 rel), CTC log-probs,
greedy tokens and prefix-beam (beam 4) n-best tokens and scores; batched rows equal single rows.
"""

from __future__ import annotations

import json
import warnings

import pytest
import sentencepiece
import soundfile
import torch

import oasr
from oasr import plugins
from oasr.checkpoints.native import save_native
from oasr.decoding.ctc import ctc_prefix_beam_search
from oasr.engine import Engine, EngineConfig
from oasr.engine.options import DecodingOptions
from oasr.errors import CheckpointFormatError
from oasr.features import extract_features_batch
from oasr.models.registry import converter_for, detect_architecture
from oasr_models_icefall import release
from oasr_models_icefall.conformer_ctc3.convert import IcefallConformerCtcConverter
from oasr_models_icefall.conformer_ctc3.model import fold_log_scales

from .conftest import CLIPS, ZIPFORMER, clip_path, refs, release_dir, results

NAME = "conformer_ctc3"
ARCH = "icefall_conformer"
BEAM = 4
#: float noise between this implementation and icefall's on the CTC log-probs (measured ~1e-5):
#: a token comparison is only meaningful where the reference's decision margin exceeds it
NOISE = 1e-3


def assert_rel(actual: torch.Tensor, expected: torch.Tensor, tol: float = 1e-4) -> None:
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    err = (actual.double() - expected.double()).abs().max().item()
    scale = expected.double().abs().max().item()
    assert err <= tol * scale, f"max abs error {err:.3g} > {tol} x {scale:.3g}"


@pytest.fixture(scope="module")
def model_dir(fixtures_dir):
    return release_dir(fixtures_dir, NAME)


@pytest.fixture(scope="module")
def ref(fixtures_dir):
    return refs(fixtures_dir, NAME)


@pytest.fixture(scope="module")
def res(fixtures_dir):
    return results(fixtures_dir, NAME)


@pytest.fixture(scope="module")
def engine(model_dir):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine = Engine(EngineConfig(model=str(model_dir)))
    about_load = [str(w.message) for w in caught if str(model_dir) in str(w.message)]
    assert about_load == [], about_load  # a clean load: nothing dropped, no capability hint
    return engine


@pytest.fixture(scope="module")
def audio(fixtures_dir):
    return {c: torch.from_numpy(soundfile.read(clip_path(fixtures_dir, c), dtype="int16")[0]).float() / 32768
            for c in CLIPS}


@pytest.fixture(scope="module")
def features(engine, audio):
    """Features of both clips as the engine computes them, one padded batch."""
    return extract_features_batch([audio[c] for c in CLIPS], engine.feature_config)


# -- registration, detection, conversion ------------------------------------------------------------
def test_registered_by_oasr_models_icefall():
    assert ARCH in oasr.list_models()
    assert plugins.registry("models").get(ARCH).distribution == "oasr-models-icefall"


def test_detects_conformer_ctc3_releases_only(model_dir, fixtures_dir):
    assert detect_architecture(model_dir) == ARCH
    converter = IcefallConformerCtcConverter()
    for name in ZIPFORMER:  # zipformer releases share the layout: never claimed
        assert not converter.detect(release_dir(fixtures_dir, name)), name
    assert not converter.detect(fixtures_dir / "wenet_u2pp" / "model")


def test_config_inferred_from_shapes_matches_the_training_flags(model_dir):
    args = json.loads((model_dir / "ref" / "model_args.json").read_text())
    converted = converter_for(ARCH).convert(model_dir)
    config = converted.model_config
    assert (config.encoder_dim, config.nhead, config.dim_feedforward, config.num_encoder_layers,
            config.vocab_size, config.feature_dim, config.causal) == (
        args["encoder_dim"], args["nhead"], args["dim_feedforward"], args["num_encoder_layers"],
        args["vocab_size"], args["feature_dim"], args["causal_convolution"])
    model = oasr.from_pretrained(model_dir)
    assert model.encoder.subsampling_rate == args["subsampling_factor"]
    assert converted.decoding.decode_type == "ctc" and converted.decoding.blank_id == 0
    assert converted.decoding.options["beam_size"] == BEAM
    assert converted.tokenizer.kind == "sentencepiece"
    assert converted.features == release.feature_spec(num_mel_bins=80)


def test_every_checkpoint_tensor_is_used(model_dir, res):
    loaded = oasr.load_pretrained(model_dir)
    assert list(loaded.load_report.dropped) == [] and list(loaded.load_report.missing) == []
    # icefall counts each log-scale as a parameter; folded, they are gone from ours
    raw = release.load_state_dict(model_dir)
    n_scales = sum(1 for k in raw if k.endswith("_scale"))
    n_ours = sum(p.numel() for p in loaded.model.parameters()) + sum(
        b.numel() for n, b in loaded.model.named_buffers() if n.endswith("norm_final.eps"))
    assert n_ours + n_scales == res["n_params"]


def test_log_scales_fold_into_their_tensors():
    state = {"a.weight": torch.full((2, 2), 3.0), "a.weight_scale": torch.tensor(0.5), "a.bias": torch.ones(2),
             "a.bias_scale": torch.tensor(-1.0), "n.eps": torch.tensor(0.1)}
    folded = fold_log_scales(state)
    assert set(folded) == {"a.weight", "a.bias", "n.eps"}
    torch.testing.assert_close(folded["a.weight"], torch.full((2, 2), 3.0 * torch.tensor(0.5).exp().item()))
    torch.testing.assert_close(folded["a.bias"], torch.ones(2) * torch.tensor(-1.0).exp())
    with pytest.raises(CheckpointFormatError, match="a.weight"):
        fold_log_scales({"a.weight_scale": torch.tensor(0.0)})


def test_a_zipformer_release_forced_to_this_architecture_is_refused(fixtures_dir):
    path = release_dir(fixtures_dir, "zipformer_ctc")
    with pytest.raises(CheckpointFormatError, match="not an icefall conformer_ctc3"):
        oasr.load_pretrained(path, architecture=ARCH)


# -- numerics from audio ------------------------------------------------------------------------------
@pytest.mark.parametrize("row,clip", list(enumerate(CLIPS)))
def test_features_from_audio_equal_icefalls(features, ref, row, clip):
    feats, lens = features
    expected = ref[clip]["fbank"].double()
    assert int(lens[row]) == expected.shape[0]
    got = feats[row, : lens[row]].double()
    # energy-aware: float32 Kaldi fbanks differ only in the log of near-silent bins
    top = expected.max(dim=1, keepdim=True).values
    assert ((got.exp() - expected.exp()).abs() / top.exp()).max() < 1e-4
    loud = expected > top - 10.0
    assert (got - expected)[loud].abs().max() < 1e-3


@pytest.mark.parametrize("clip", CLIPS)
def test_encoder_and_ctc_log_probs_equal_icefalls(engine, ref, features, clip):
    model = engine.model
    fbank = ref[clip]["fbank"]
    with torch.no_grad():
        hidden, lens = model.encode_offline(fbank[None], torch.tensor([fbank.shape[0]]))
        log_probs = model.ctc_log_probs(hidden)
        assert_rel(hidden[0], ref[clip]["encoder_out"])
        assert_rel(log_probs[0], ref[clip]["ctc_log_probs"])
        # and from the engine's own features of the audio
        row = CLIPS.index(clip)
        feats, feat_lens = features
        hidden, lens = model.encode_offline(feats[row : row + 1, : feat_lens[row]], feat_lens[row : row + 1])
    assert_rel(hidden[0], ref[clip]["encoder_out"])
    assert int(lens[0]) == ref[clip]["encoder_out"].shape[0]


def _greedy_margin(log_probs: torch.Tensor) -> float:
    top2 = log_probs.topk(2, dim=-1).values
    return float((top2[:, 0] - top2[:, 1]).min())


def test_greedy_tokens_from_audio_equal_icefalls(engine, ref, res, fixtures_dir):
    for clip in CLIPS:
        # every frame's argmax is decided by more than the float noise: an exact comparison is sound
        assert _greedy_margin(ref[clip]["ctc_log_probs"]) > NOISE, clip
    outputs = engine.transcribe_outputs([str(clip_path(fixtures_dir, c)) for c in CLIPS])
    for out, clip in zip(outputs, CLIPS, strict=True):
        assert out.error is None
        assert out.tokens == res["clips"][clip]["ctc_greedy"] == ref[clip]["ctc_greedy_hyp"].tolist()


def test_prefix_beam_n_best_from_audio_equals_icefalls(engine, res, fixtures_dir, model_dir):
    sp = sentencepiece.SentencePieceProcessor(model_file=str(release.lang_dir(model_dir) / "bpe.model"))
    options = DecodingOptions(beam_size=BEAM, n_best=BEAM)
    outputs = engine.transcribe_outputs([str(clip_path(fixtures_dir, c)) for c in CLIPS], decoding=options)
    for out, clip in zip(outputs, CLIPS, strict=True):
        expected = res["clips"][clip]
        assert out.error is None
        assert out.tokens == expected["ctc_prefix_beam_best"]
        assert out.nbest == [sp.decode(h["ys"]) for h in expected["ctc_prefix_beam_nbest"]]


def test_prefix_beam_n_best_tokens_and_scores(engine, res, features):
    feats, feat_lens = features
    with torch.no_grad():
        log_probs, lens = engine.model.forward_offline(feats, feat_lens)
    nbest = ctc_prefix_beam_search(log_probs, lens, beam_size=BEAM, n_best=BEAM)
    for hyps, clip in zip(nbest, CLIPS, strict=True):
        expected = res["clips"][clip]["ctc_prefix_beam_nbest"]
        scores = [h["log_prob"] for h in expected]
        # the ranking is decided by more than the float noise of the scores
        assert min(a - b for a, b in zip(scores, scores[1:], strict=False)) > NOISE
        assert [h.tokens for h in hyps] == [h["ys"] for h in expected]
        # a float32 forward's scores (sums over ~100 frames of ~25 nats) move by ~5e-6 relative between CPUs
        # (MKL takes other kernels on Intel than on AMD): 1.3e-4 here on an Intel Xeon, still 8x under NOISE
        assert [h.score for h in hyps] == pytest.approx(scores, rel=2e-5, abs=NOISE / 10)


# -- batching -----------------------------------------------------------------------------------------
def test_batched_rows_equal_single_rows_whatever_the_padding(engine, features):
    feats, feat_lens = features
    model = engine.model
    garbage = feats.clone()
    for row, n in enumerate(feat_lens.tolist()):
        garbage[row, n:] = 7.0  # not what any extractor pads with: the valid outputs must not see it
    with torch.no_grad():
        batched, lens = model.encode_offline(feats, feat_lens)
        other, _ = model.encode_offline(garbage, feat_lens)
        for row, n in enumerate(feat_lens.tolist()):
            single, single_lens = model.encode_offline(feats[row : row + 1, :n], feat_lens[row : row + 1])
            assert int(single_lens[0]) == int(lens[row])
            assert_rel(batched[row, : lens[row]], single[0], 1e-5)
            assert_rel(other[row, : lens[row]], single[0], 1e-5)


def test_engine_batch_equals_each_alone(engine, fixtures_dir):
    paths = [str(clip_path(fixtures_dir, c)) for c in CLIPS]
    options = DecodingOptions(beam_size=BEAM, n_best=2)
    together = engine.transcribe_outputs(paths, decoding=options)
    for path, out in zip(paths, together, strict=True):
        alone = engine.transcribe_outputs(path, decoding=options)
        assert (alone.tokens, alone.nbest) == (out.tokens, out.nbest)


# -- native bundle ------------------------------------------------------------------------------------
def test_native_bundle_round_trip(model_dir, tmp_path, ref):
    loaded = oasr.load_pretrained(model_dir)
    bundle = save_native(loaded, tmp_path / "bundle")
    again = oasr.load_pretrained(bundle)
    assert again.architecture == ARCH and again.config == loaded.config
    fbank = ref["clip0"]["fbank"][None]
    with torch.no_grad():
        torch.testing.assert_close(again.model.encode_offline(fbank, torch.tensor([fbank.shape[1]]))[0],
                                   loaded.model.encode_offline(fbank, torch.tensor([fbank.shape[1]]))[0])
