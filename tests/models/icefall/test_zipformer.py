"""icefall's Zipformer2 (``zipformer``) against the fixtures icefall's own code made.

Encoder parity per stack from the fixture features; CTC through the public engine from audio;
the config inferred from shapes against the training flags; detection and the CLI.
"""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch
from torch.nn.utils.rnn import pad_sequence

import oasr
from oasr.engine import DecodingOptions, Engine, EngineConfig
from oasr.errors import CheckpointFormatError, ConfigError
from oasr.features import FeatureConfig, extract_features_batch
from oasr_models_icefall import release
from oasr_models_icefall.zipformer.config import RELEASE_CHUNK_SIZE, RELEASE_LEFT_CONTEXT_FRAMES
from oasr_models_icefall.zipformer.convert import infer_zipformer_config

from . import _zipformer_helpers as zh
from .conftest import CAUSAL, CLIPS, TRANSDUCERS, ZIPFORMER, clip_path, refs, release_dir, results

CTC = tuple(n for n in ZIPFORMER if n not in TRANSDUCERS)
PARITY = 1e-4
torch.set_num_threads(1)


def _flag_ints(flags: dict[str, str], name: str) -> tuple[int, ...]:
    return tuple(int(v) for v in flags[name].split(","))


@pytest.mark.parametrize("name", ZIPFORMER)
def test_config_inferred_from_shapes_equals_the_training_flags(fixtures_dir, name):
    import json

    directory = release_dir(fixtures_dir, name)
    flags = zh.training_flags(json.loads((directory / "ref" / "model_args.json").read_text()))
    config = infer_zipformer_config(release.load_state_dict(directory))
    for field in ("num_encoder_layers", "downsampling_factor", "feedforward_dim", "num_heads", "encoder_dim",
                  "cnn_module_kernel"):
        assert getattr(config, field) == _flag_ints(flags, field), field
    stacks = len(config.encoder_dim)
    for field in ("query_head_dim", "value_head_dim", "pos_head_dim"):
        assert getattr(config, field) == _flag_ints(flags, field) * stacks, field
    assert config.pos_dim == int(flags["pos_dim"])
    # encoder_unmasked_dim only masks features in training: nothing of it is in the weights
    assert all(u <= d for u, d in zip(_flag_ints(flags, "encoder_unmasked_dim"), config.encoder_dim, strict=True))
    assert config.causal == (flags.get("causal") == "1") == (name in CAUSAL)
    if config.causal:
        assert config.chunk_size == int(flags["chunk_size"]) == RELEASE_CHUNK_SIZE
        # releases decode at left context 128; these fixtures were trained (and decoded) at 64
        assert config.left_context_frames == RELEASE_LEFT_CONTEXT_FRAMES
        assert int(flags["left_context_frames"]) == zh.FIXTURE_LEFT_CONTEXT
    else:
        assert config.chunk_size == -1
    assert (config.feature_dim, config.output_size) == (80, max(config.encoder_dim))


@pytest.mark.parametrize("name", ZIPFORMER)
def test_encoder_matches_icefall_stack_by_stack(fixtures_dir, name):
    encoder = zh.encoder_of(release_dir(fixtures_dir, name))
    geometry = {"left_context_frames": zh.FIXTURE_LEFT_CONTEXT} if name in CAUSAL else {}
    for clip, ref in refs(fixtures_dir, name).items():
        feats = ref["fbank"][None]
        lens = torch.tensor([feats.shape[1]])
        with torch.no_grad():
            embed, embed_lens = encoder.embed(feats, lens)
            stacks: list[torch.Tensor] = []
            out, out_lens = encoder(feats, lens, stack_outputs=stacks, **geometry)
        assert zh.rel_err(embed[0], ref["encoder_embed_out"]) < PARITY, clip
        assert len(stacks) == 6
        for i, stack in enumerate(stacks):
            assert zh.rel_err(stack[:, 0], ref[f"encoder_stack{i}_out"]) < PARITY, (clip, i)
        assert zh.rel_err(out[0], ref["encoder_out"]) < PARITY, clip
        assert out_lens.tolist() == [ref["encoder_out"].shape[0]] and embed_lens.tolist() == [embed.shape[1]]


@pytest.mark.parametrize("name", CAUSAL)
def test_causal_chunk_mask_geometry(fixtures_dir, name):
    """A causal release's offline output depends on the chunk mask: the fixture's ``encoder_out`` is
    icefall's chunk 16 / left 64, ``encoder_out_chunk-1`` its unmasked (chunk -1) output."""
    encoder = zh.encoder_of(release_dir(fixtures_dir, name))
    ref = refs(fixtures_dir, name)["clip1"]
    feats, lens = ref["fbank"][None], torch.tensor([ref["fbank"].shape[0]])
    with torch.no_grad():
        unmasked, _ = encoder(feats, lens, chunk_size=-1)
        release_geometry, _ = encoder(feats, lens)
    assert zh.rel_err(unmasked[0], ref["encoder_out_chunk-1"]) < PARITY
    assert (ref["encoder_out_chunk-1"] - ref["encoder_out"]).abs().max() > 1e-2  # the two really differ
    # 161 embed frames: left context 128 reaches chunks that 64 masks, so the release default differs
    assert zh.rel_err(release_geometry[0], ref["encoder_out"]) > 1e-3


@pytest.mark.parametrize("name", ZIPFORMER)
def test_batched_encoder_reproduces_icefalls_padding_difference(fixtures_dir, name):
    """Both clips in one batch: the longer equals its single run, the shorter differs from its single
    run exactly as much as icefall's batch of two (its log(1e-10) feature padding reaches the
    shorter clip through the embed's convolutions)."""
    encoder = zh.encoder_of(release_dir(fixtures_dir, name))
    expected = results(fixtures_dir, name)["batch2_encoder_max_abs_diff_vs_single"]
    geometry = {"left_context_frames": zh.FIXTURE_LEFT_CONTEXT} if name in CAUSAL else {}
    references = refs(fixtures_dir, name)
    feats = [references[c]["fbank"] for c in CLIPS]
    lens = torch.tensor([f.shape[0] for f in feats])
    with torch.no_grad():
        # zero padding on purpose: the encoder refills padded frames with LOG_EPS itself
        batched, batched_lens = encoder(pad_sequence(feats, batch_first=True), lens, **geometry)
        for i, clip in enumerate(CLIPS):
            single, _ = encoder(feats[i][None], lens[i:i + 1], **geometry)
            diff = (batched[i, : batched_lens[i]] - single[0]).abs().max().item()
            assert diff == pytest.approx(expected[clip], abs=1e-5), clip
    assert expected["clip0"] > 1e-2  # the reference difference is real, so the check has teeth


@pytest.fixture(scope="module")
def engines(fixtures_dir):
    """One offline engine per CTC fixture, at the geometry the fixture was decoded with."""
    out = {}
    for name in CTC:
        options = {"left_context_frames": zh.FIXTURE_LEFT_CONTEXT} if name in CAUSAL else {}
        out[name] = Engine(EngineConfig(model=str(release_dir(fixtures_dir, name)), model_options=options))
    return out


@pytest.mark.parametrize("name", CTC)
def test_ctc_log_probs_from_audio(fixtures_dir, engines, name):
    """Features from the wav (the checkpoint's FeatureSpec through core's kaldi_fbank) and the model's
    CTC head give icefall's log-probs."""
    model = engines[name].model
    config = FeatureConfig.from_spec(release.feature_spec())
    for clip, ref in refs(fixtures_dir, name).items():
        feats, lens = extract_features_batch([zh.wave(clip_path(fixtures_dir, clip))], config)
        with torch.no_grad():
            log_probs, out_lens = model.forward_offline(feats, lens)
        assert out_lens.tolist() == [ref["ctc_log_probs"].shape[0]]
        assert (log_probs[0] - ref["ctc_log_probs"]).abs().max() < 1e-3, clip
        with torch.no_grad():
            exact, _ = model.forward_offline(ref["fbank"][None], torch.tensor([ref["fbank"].shape[0]]))
        assert zh.rel_err(exact[0], ref["ctc_log_probs"]) < 1e-5, clip


@pytest.mark.parametrize("name", CTC)
def test_engine_greedy_and_prefix_beam_equal_icefalls(fixtures_dir, engines, name):
    engine = engines[name]
    expected = results(fixtures_dir, name)["clips"]
    for clip, ref in refs(fixtures_dir, name).items():
        audio = zh.wave(clip_path(fixtures_dir, clip)).numpy()
        greedy = engine.transcribe_outputs(audio)
        assert greedy.error is None
        top2 = ref["ctc_log_probs"].topk(2, dim=-1).values
        margin = top2[:, 0] - top2[:, 1]
        if margin.min() > 2e-3:  # well above the 2e-4 audio-path noise: the sequence cannot hinge on it
            assert greedy.tokens == ref["ctc_greedy_hyp"].tolist() == expected[clip]["ctc_greedy"], clip
        else:  # a near-tie frame: compare the frames the noise cannot flip (nearly all of them)
            robust = margin > 2e-3
            assert robust.float().mean() > 0.95
            model = engine.model
            feats = ref["fbank"][None]
            with torch.no_grad():
                log_probs, _ = model.forward_offline(feats, torch.tensor([feats.shape[1]]))
            assert torch.equal(log_probs[0].argmax(-1)[robust], ref["ctc_log_probs"].argmax(-1)[robust])
        beam = engine.transcribe_outputs(audio, decoding=DecodingOptions(beam_size=4, n_best=4))
        nbest = expected[clip]["ctc_prefix_beam_nbest"]
        assert beam.tokens == expected[clip]["ctc_prefix_beam_best"] == nbest[0]["ys"], clip
        assert beam.nbest == [engine.tokenizer.decode(h["ys"]) for h in nbest], clip


@pytest.mark.parametrize("name", CTC)
def test_engine_batch_of_two_and_single_equal_single(fixtures_dir, engines, name):
    """The longer clip is unchanged by batching (icefall: 0.0 difference), so its batched tokens
    equal icefall's single run; each clip alone equals itself alone, run after run."""
    engine = engines[name]
    expected = results(fixtures_dir, name)
    audio = [zh.wave(clip_path(fixtures_dir, c)).numpy() for c in CLIPS]
    batched = engine.transcribe_outputs(audio)
    assert expected["batch2_encoder_max_abs_diff_vs_single"]["clip1"] == 0.0
    assert batched[1].tokens == expected["clips"]["clip1"]["ctc_greedy"]
    singles = [engine.transcribe_outputs(a).tokens for a in audio]
    assert singles == [engine.transcribe_outputs(a).tokens for a in audio]
    assert singles[0] == expected["clips"]["clip0"]["ctc_greedy"]


@pytest.mark.parametrize("name", CTC)
def test_ctc_release_auto_detects_as_zipformer(fixtures_dir, name):
    directory = release_dir(fixtures_dir, name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = oasr.load_pretrained(directory)
    assert [str(w.message) for w in caught if str(directory) in str(w.message)] == []
    assert loaded.architecture == "zipformer"
    assert list(loaded.load_report.missing) == [] and list(loaded.load_report.dropped) == []
    assert loaded.decoding_defaults.decode_type == "ctc" and loaded.decoding_defaults.blank_id == 0
    assert loaded.model.encoder.subsampling_rate == 4 and loaded.model.encoder.output_size == 64


@pytest.mark.parametrize("name", TRANSDUCERS)
def test_transducer_release_without_ctc_head_names_the_architecture(fixtures_dir, name):
    with pytest.raises(CheckpointFormatError, match="architecture='transducer'"):
        oasr.load_pretrained(release_dir(fixtures_dir, name))


def test_hybrid_transducer_release_loads_its_ctc_branch(fixtures_dir, tmp_path):
    """A transducer release that also trained a CTC head loads as zipformer CTC: the transducer
    branch is a named warning, the training-only simple_*_proj are silent."""
    import shutil

    source = release_dir(fixtures_dir, "zipformer_transducer")
    shutil.copytree(source / "data", tmp_path / "data")
    (tmp_path / "exp").mkdir()
    state = release.load_state_dict(source)
    assert any(k.startswith("simple_am_proj.") for k in state)
    ctc = release.load_state_dict(release_dir(fixtures_dir, "zipformer_ctc"))
    state.update({k: v for k, v in ctc.items() if k.startswith("ctc_output.")})
    torch.save({"model": state}, tmp_path / "exp" / "pretrained.pt")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = oasr.load_pretrained(tmp_path)
    messages = [str(w.message) for w in caught]
    assert loaded.architecture == "zipformer"
    assert any("architecture='transducer'" in m for m in messages), messages
    assert not any("simple_am_proj" in m or "simple_lm_proj" in m for m in messages), messages
    ref = refs(fixtures_dir, "zipformer_transducer")["clip0"]
    with torch.no_grad():
        hidden, _ = loaded.model.encode_offline(ref["fbank"][None], torch.tensor([ref["fbank"].shape[0]]))
    assert zh.rel_err(hidden[0], ref["encoder_out"]) < PARITY


def test_oasr_transcribe_cli(fixtures_dir, engines):
    directory = release_dir(fixtures_dir, "zipformer_ctc")
    audio = clip_path(fixtures_dir, "clip0")
    expected = engines["zipformer_ctc"].transcribe_outputs(zh.wave(audio).numpy()).text
    done = subprocess.run([sys.executable, "-m", "oasr.cli", "transcribe", str(audio), "--model", str(directory),
                           "-f", "text", "--no-progress"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert expected and done.stdout.strip() == expected


def test_native_bundle_round_trip(fixtures_dir, tmp_path):
    """``oasr convert`` of a causal release: the bundle reloads with the same config (release decode
    geometry included) and the same encoder output, every tensor mapped."""
    from oasr.checkpoints.convert import convert

    directory = release_dir(fixtures_dir, "zipformer_ctc_causal")
    convert(str(directory), tmp_path / "bundle")
    loaded = oasr.load_pretrained(tmp_path / "bundle")
    assert loaded.architecture == "zipformer"
    assert loaded.config == oasr.load_pretrained(directory).config
    assert list(loaded.load_report.missing) == [] and list(loaded.load_report.dropped) == []
    model = loaded.model.eval()
    model.configure(type(model.options)(left_context_frames=zh.FIXTURE_LEFT_CONTEXT))
    ref = refs(fixtures_dir, "zipformer_ctc_causal")["clip0"]
    with torch.no_grad():
        hidden, _ = model.encode_offline(ref["fbank"][None], torch.tensor([ref["fbank"].shape[0]]))
    assert zh.rel_err(hidden[0], ref["encoder_out"]) < PARITY


def test_audio_too_short_for_one_frame_decodes_to_nothing(fixtures_dir, engines):
    """50 ms is 5 feature frames, fewer than encoder_embed's convolutions take: an empty transcript,
    alone and beside a normal clip (which is unaffected), not an error."""
    engine = engines["zipformer_ctc"]
    short = zh.wave(clip_path(fixtures_dir, "clip1"))[:800].numpy()
    clip0 = zh.wave(clip_path(fixtures_dir, "clip0")).numpy()
    alone = engine.transcribe_outputs(short, sample_rate=16000)
    assert alone.error is None and alone.tokens == []
    together = engine.transcribe_outputs([short, clip0], sample_rate=16000)
    assert [o.error for o in together] == [None, None] and together[0].tokens == []
    assert together[1].tokens == results(fixtures_dir, "zipformer_ctc")["clips"]["clip0"]["ctc_greedy"]


@pytest.mark.parametrize("name,options,key", [
    ("zipformer_ctc", {"chunk_size": 16}, "chunk_size"),
    ("zipformer_ctc", {"left_context_frames": 64}, "left_context_frames"),
    ("zipformer_ctc_causal", {"chunk_size": 12}, "chunk_size"),
    ("zipformer_ctc_causal", {"chunk_size": 0}, "chunk_size"),
    ("zipformer_ctc_causal", {"left_context_frames": 16}, "left_context_frames"),
])
def test_chunk_geometry_the_checkpoint_cannot_use_is_refused(fixtures_dir, name, options, key):
    with pytest.raises(ConfigError, match=key) as info:
        Engine(EngineConfig(model=str(release_dir(fixtures_dir, name)), model_options=options))
    assert info.value.key == key


def test_causal_release_decodes_unmasked_when_asked(fixtures_dir):
    """``chunk_size=-1`` turns the chunk mask off: the engine's model then gives icefall's chunk -1 output."""
    engine = Engine(EngineConfig(model=str(release_dir(fixtures_dir, "zipformer_ctc_causal")),
                                 model_options={"chunk_size": -1}))
    ref = refs(fixtures_dir, "zipformer_ctc_causal")["clip1"]
    with torch.no_grad():
        hidden, _ = engine.model.encode_offline(ref["fbank"][None], torch.tensor([ref["fbank"].shape[0]]))
    assert zh.rel_err(hidden[0], ref["encoder_out_chunk-1"]) < PARITY


@pytest.mark.parametrize("name", CTC)
def test_prefix_beam_nbest_token_ids_and_scores(fixtures_dir, engines, name):
    """The engine's own CTC strategy on features from the wav: icefall's beam-4 n-best, token ids in
    order, scores to float32 noise (each clip alone, as the reference ran)."""
    from oasr.decoding.strategy import DecodeBatch

    engine = engines[name]
    config = FeatureConfig.from_spec(release.feature_spec())
    for clip in CLIPS:
        samples = zh.wave(clip_path(fixtures_dir, clip))
        feats, lens = extract_features_batch([samples], config)
        batch = DecodeBatch(request_ids=[clip], options=[DecodingOptions(beam_size=4, n_best=4)], waveforms=[samples],
                            feats=feats, feat_lens=lens)
        (hyp,) = engine.strategy.decode(batch)
        expected = results(fixtures_dir, name)["clips"][clip]["ctc_prefix_beam_nbest"]
        assert [h.tokens for h in hyp.nbest] == [e["ys"] for e in expected], clip
        noise = max(abs(h.score - e["log_prob"]) for h, e in zip(hyp.nbest, expected, strict=True))
        assert noise < 1e-3, clip
        gaps = [a["log_prob"] - b["log_prob"] for a, b in zip(expected, expected[1:], strict=False)]
        assert min(gaps) > 2 * noise, (gaps, noise)  # the order does not hinge on the float noise
