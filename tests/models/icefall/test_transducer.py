"""icefall transducer, model side: the stateless predictor, the joiner, the converter and the
searches over them, against references made by icefall's own code (``../shared/fixtures``)."""

from __future__ import annotations

import pytest
import torch

from oasr.models.transducer import TransducerJoiner, TransducerPredictor
from oasr_models_icefall.transducer.config import JoinerConfig, StatelessDecoderConfig
from oasr_models_icefall.transducer.decoder import StatelessDecoder
from oasr_models_icefall.transducer.joiner import Joiner

from .conftest import CLIPS, TRANSDUCERS, refs, release_dir

# icefall computes joiner logits in float32 with its own op order: differences of ~1e-5 on logits of
# magnitude ~10 are float noise; the references are otherwise exact
LOGIT_TOL = dict(rtol=1e-5, atol=3e-5)


def _state(fixtures_dir, name: str) -> dict[str, torch.Tensor]:
    return torch.load(release_dir(fixtures_dir, name) / "exp" / "pretrained.pt", map_location="cpu",
                      weights_only=True)["model"]


def _prefixed(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def predictor_and_joiner(fixtures_dir, name: str) -> tuple[StatelessDecoder, Joiner]:
    """The release's decoder and joiner, built at the shapes icefall's train.py flags give them."""
    state = _state(fixtures_dir, name)
    vocab, dim = state["decoder.embedding.weight"].shape
    decoder = StatelessDecoder(StatelessDecoderConfig(vocab_size=vocab, decoder_dim=dim, context_size=2))
    joiner = Joiner(JoinerConfig(encoder_dim=64, decoder_dim=dim, joiner_dim=48, vocab_size=vocab))
    decoder.load_state_dict(_prefixed(state, "decoder."))
    joiner.load_state_dict(_prefixed(state, "joiner."))
    return decoder.eval(), joiner.eval()


@pytest.mark.parametrize("name", TRANSDUCERS)
def test_start_window_and_first_joint_match_icefall(fixtures_dir, name):
    decoder, joiner = predictor_and_joiner(fixtures_dir, name)
    assert isinstance(decoder, TransducerPredictor) and isinstance(joiner, TransducerJoiner)
    state = decoder.init_state(1, torch.device("cpu"))
    assert state.tolist() == [[-1, 0]]
    for clip in CLIPS:
        ref = refs(fixtures_dir, name)[clip]
        with torch.no_grad():
            pred = decoder.predict(state)
            torch.testing.assert_close(pred[0], ref["decoder_out_init"], rtol=0, atol=1e-6)
            logits = joiner.joint(joiner.project_encoder(ref["encoder_out"][0]), joiner.project_predictor(pred[0]))
        torch.testing.assert_close(logits, ref["joiner_logits_t0_init"], **LOGIT_TOL)


@pytest.mark.parametrize("name", TRANSDUCERS)
def test_a_blank_filled_start_window_is_a_different_input(fixtures_dir, name):
    """The negative id embeds to zero; a window of blanks would feed the learned blank row."""
    decoder, _ = predictor_and_joiner(fixtures_dir, name)
    ref = refs(fixtures_dir, name)["clip0"]
    with torch.no_grad():
        blanks = decoder.predict(torch.zeros(1, 2, dtype=torch.int64))
    assert (blanks[0] - ref["decoder_out_init"]).abs().max() > 1e-2


def test_predictor_state_moves_as_a_label_window():
    torch.manual_seed(0)
    decoder = StatelessDecoder(StatelessDecoderConfig(vocab_size=11, decoder_dim=8, context_size=3)).eval()
    state = decoder.init_state(3, torch.device("cpu"))
    assert state.tolist() == [[-1, -1, 0]] * 3
    state = decoder.advance(state, torch.tensor([5, 6, 7]), torch.tensor([True, False, True]))
    assert state.tolist() == [[-1, 0, 5], [-1, -1, 0], [-1, 0, 7]]
    picked = decoder.select(state, torch.tensor([2, 2, 0]))
    assert picked.tolist() == [[-1, 0, 7], [-1, 0, 7], [-1, 0, 5]]
    rows = decoder.unstack_states(state)
    assert [r.shape for r in rows] == [(1, 3)] * 3
    assert torch.equal(decoder.stack_states(rows), state)
    with torch.no_grad():
        # the window output equals the last step of the full-sequence (training) forward
        full = decoder(torch.tensor([[0, 5]]))
        torch.testing.assert_close(decoder.predict(torch.tensor([[-1, 0, 5]])), full[:, -1])
        rows_out = decoder.predict(state)
        for b in range(3):
            torch.testing.assert_close(rows_out[b:b + 1], decoder.predict(state[b:b + 1]))


def test_context_size_one_is_an_embedding_lookup():
    torch.manual_seed(0)
    decoder = StatelessDecoder(StatelessDecoderConfig(vocab_size=11, decoder_dim=8, context_size=1)).eval()
    assert decoder.conv is None
    state = decoder.advance(decoder.init_state(2, torch.device("cpu")), torch.tensor([3, 4]),
                            torch.tensor([True, True]))
    with torch.no_grad():
        torch.testing.assert_close(decoder.predict(state), decoder.embedding.weight[[3, 4]])


# -- searches over the fixtures' encoder outputs (core's transducer searches, this predictor/joiner) ----
def _results(fixtures_dir, name: str) -> dict:
    from .conftest import results

    return results(fixtures_dir, name)["clips"]


def _projected(joiner: Joiner, encoder_outs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The clips' encoder outputs as one zero-padded batch, projected once per frame."""
    lengths = torch.tensor([e.shape[0] for e in encoder_outs])
    batch = torch.nn.utils.rnn.pad_sequence(encoder_outs, batch_first=True)
    with torch.no_grad():
        return joiner.project_encoder(batch), lengths


@pytest.mark.parametrize("name", TRANSDUCERS)
@pytest.mark.parametrize("max_symbols", [1, 3])
def test_greedy_search_matches_icefall(fixtures_dir, name, max_symbols):
    from oasr.decoding.transducer import transducer_greedy_search

    decoder, joiner = predictor_and_joiner(fixtures_dir, name)
    ref, res = refs(fixtures_dir, name), _results(fixtures_dir, name)
    for clip in CLIPS:
        want = res[clip][f"greedy_search_max_sym{max_symbols}"]
        if max_symbols == 1:
            assert want == ref[clip]["greedy_search_batch_hyp"].tolist() == res[clip]["greedy_search_batch"]
        enc, lens = _projected(joiner, [ref[clip]["encoder_out"]])
        with torch.no_grad():
            hyp, = transducer_greedy_search(decoder, joiner, enc, lens, blank_id=0, max_symbols=max_symbols)
        assert hyp.tokens == want, clip
        assert len(hyp.token_frames) == len(want) and hyp.token_frames == sorted(hyp.token_frames)
        per_frame = torch.bincount(torch.tensor(hyp.token_frames)) if hyp.token_frames else torch.zeros(1)
        assert int(per_frame.max()) <= max_symbols
    # both clips in one batch: each row is searched as if alone
    enc, lens = _projected(joiner, [ref[clip]["encoder_out"] for clip in CLIPS])
    with torch.no_grad():
        hyps = transducer_greedy_search(decoder, joiner, enc, lens, blank_id=0, max_symbols=max_symbols)
    assert [h.tokens for h in hyps] == [res[clip][f"greedy_search_max_sym{max_symbols}"] for clip in CLIPS]


@pytest.mark.parametrize("name", TRANSDUCERS)
def test_modified_beam_search_matches_icefall(fixtures_dir, name):
    from oasr.decoding.transducer import transducer_modified_beam_search

    decoder, joiner = predictor_and_joiner(fixtures_dir, name)
    ref, res = refs(fixtures_dir, name), _results(fixtures_dir, name)
    want = {clip: ref[clip]["modified_beam_search_4_hyp"].tolist() for clip in CLIPS}
    assert want == {clip: res[clip]["modified_beam_search_4"] for clip in CLIPS}
    for clip in CLIPS:
        enc, lens = _projected(joiner, [ref[clip]["encoder_out"]])
        with torch.no_grad():
            (best, *_), = transducer_modified_beam_search(decoder, joiner, enc, lens, blank_id=0, beam_size=4)
        assert best.tokens == want[clip], clip
    enc, lens = _projected(joiner, [ref[clip]["encoder_out"] for clip in CLIPS])
    with torch.no_grad():
        nbests = transducer_modified_beam_search(decoder, joiner, enc, lens, blank_id=0, beam_size=4, n_best=4)
    assert [n[0].tokens for n in nbests] == [want[clip] for clip in CLIPS]
    assert all(1 <= len(n) <= 4 for n in nbests)


# -- the converter ------------------------------------------------------------------------------------
def _flag(flags: list[str], name: str) -> str:
    return flags[flags.index(name) + 1]


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(","))


@pytest.mark.parametrize("name", TRANSDUCERS)
def test_converter_infers_the_training_flags(fixtures_dir, name):
    import json

    from oasr_models_icefall.transducer.convert import IcefallTransducerConverter

    root = release_dir(fixtures_dir, name)
    args = json.loads((root / "ref" / "model_args.json").read_text())
    flags = args["flags"]
    converted = IcefallTransducerConverter().convert(root)
    config = converted.model_config
    assert converted.architecture == "transducer"
    assert config.vocab_size == args["vocab_size"] and config.blank_id == args["blank_id"]
    assert config.decoder.context_size == args["context_size"]
    assert config.decoder.decoder_dim == int(_flag(flags, "--decoder-dim"))
    assert config.joiner.joiner_dim == int(_flag(flags, "--joiner-dim"))
    assert config.joiner.encoder_dim == max(_ints(_flag(flags, "--encoder-dim")))
    assert config.encoder.encoder_dim == _ints(_flag(flags, "--encoder-dim"))
    assert config.encoder.num_encoder_layers == _ints(_flag(flags, "--num-encoder-layers"))
    assert config.encoder.causal == ("--causal" in flags and _flag(flags, "--causal") == "1")
    defaults = converted.decoding
    assert defaults.decode_type == "transducer" and defaults.blank_id == 0
    # icefall's decode.py never hands <unk> to its searches (they fall back to the blank id)
    assert "unk_id" not in defaults.options
    assert defaults.options["max_symbols"] == 1 and defaults.options["beam_size"] == 4
    assert converted.tokenizer.kind == "sentencepiece" and {0, 1, 2} <= set(converted.tokenizer.special_ids)
    assert converted.features.snip_edges is False and converted.features.high_freq == -400.0


def test_transducer_releases_are_loaded_explicitly(fixtures_dir, tmp_path):
    import warnings

    import oasr
    from oasr.models.registry import detect_architecture
    from oasr_models_icefall.transducer.convert import IcefallTransducerConverter

    root = release_dir(fixtures_dir, "zipformer_transducer")
    assert IcefallTransducerConverter().detect(root) is False
    assert detect_architecture(root) != "transducer"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # simple_am_proj / simple_lm_proj are dropped silently
        loaded = oasr.load_pretrained(root, architecture="transducer")
    assert sorted({k.split(".")[0] for k in loaded.load_report.dropped}) == ["simple_am_proj", "simple_lm_proj"]
    assert loaded.model.capabilities == frozenset({"transducer"})


def _copy_release(root, dst, state: dict[str, torch.Tensor]):
    import shutil

    shutil.copytree(root / "data", dst / "data")
    (dst / "exp").mkdir()
    torch.save({"model": state}, dst / "exp" / "pretrained.pt")
    return dst


def test_a_hybrid_checkpoint_names_the_unused_ctc_head(fixtures_dir, tmp_path):
    import oasr

    root = release_dir(fixtures_dir, "zipformer_transducer")
    state = _state(fixtures_dir, "zipformer_transducer")
    state["ctc_output.1.weight"] = torch.zeros(500, 64)
    state["ctc_output.1.bias"] = torch.zeros(500)
    hybrid = _copy_release(root, tmp_path, state)
    with pytest.warns(RuntimeWarning, match=r"'ctc_output\.'.*CTC head"):
        oasr.load_pretrained(hybrid, architecture="transducer")
    # what the hint says: without architecture= the same directory decodes with its CTC head
    with pytest.warns(RuntimeWarning, match="architecture='transducer'"):
        assert oasr.load_pretrained(hybrid).architecture == "zipformer"


def test_a_ctc_checkpoint_is_refused_as_a_transducer(fixtures_dir):
    import oasr
    from oasr.errors import CheckpointFormatError

    with pytest.raises(CheckpointFormatError, match=r"not an icefall transducer.*decoder\.embedding\.weight.*CTC head"):
        oasr.load_pretrained(release_dir(fixtures_dir, "zipformer_ctc"), architecture="transducer")


def test_inconsistent_decoder_shapes_are_refused(fixtures_dir, tmp_path):
    import oasr
    from oasr.errors import CheckpointFormatError

    state = _state(fixtures_dir, "zipformer_transducer")
    state["decoder.embedding.weight"] = torch.zeros(500, 40)
    with pytest.raises(CheckpointFormatError, match=r"decoder\.conv\.weight.*decoder dim 40"):
        oasr.load_pretrained(_copy_release(release_dir(fixtures_dir, "zipformer_transducer"), tmp_path, state),
                             architecture="transducer")


# -- end to end from audio, through the engine -----------------------------------------------------
def engine_config(fixtures_dir, name: str, **overrides):
    from oasr.engine import EngineConfig

    # the causal fixtures were trained and referenced with a 64-frame left context (releases: 128)
    options = {"left_context_frames": 64} if "causal" in name else {}
    return EngineConfig(model=str(release_dir(fixtures_dir, name)), architecture="transducer",
                        model_options=options, **overrides)


@pytest.fixture(scope="module", params=TRANSDUCERS)
def engine(request, fixtures_dir):
    from oasr.engine import Engine

    return request.param, Engine(engine_config(fixtures_dir, request.param, max_batch_size=1))


def _audio(fixtures_dir, clip: str):
    import soundfile as sf

    from .conftest import clip_path

    samples, rate = sf.read(clip_path(fixtures_dir, clip), dtype="float32")
    assert rate == 16000
    return samples


def test_engine_greedy_and_beam_from_audio_match_icefall(fixtures_dir, engine):
    from oasr.engine import DecodingOptions

    name, eng = engine
    assert eng.decode_method == "transducer"
    ref = refs(fixtures_dir, name)
    for clip in CLIPS:
        audio = _audio(fixtures_dir, clip)
        greedy = eng.transcribe_outputs(audio, sample_rate=16000)
        assert greedy.finish_reason == "stop" and greedy.tokens == ref[clip]["greedy_search_batch_hyp"].tolist()
        assert greedy.text and greedy.confidence is not None
        beam = eng.transcribe_outputs(audio, sample_rate=16000, decoding=DecodingOptions(beam_size=4, n_best=2))
        assert beam.tokens == ref[clip]["modified_beam_search_4_hyp"].tolist()
        assert beam.nbest and len(beam.nbest) == 2 and beam.nbest[0] == beam.text


@pytest.mark.parametrize("name", TRANSDUCERS)
def test_engine_max_symbols_three_matches_icefall(fixtures_dir, name):
    from oasr.engine import Engine

    eng = Engine(engine_config(fixtures_dir, name, decode_options={"max_symbols": 3}))
    res = _results(fixtures_dir, name)
    for clip in CLIPS:
        assert eng.transcribe_outputs(_audio(fixtures_dir, clip), sample_rate=16000).tokens == \
            res[clip]["greedy_search_max_sym3"]


@pytest.mark.parametrize("name", TRANSDUCERS)
def test_engine_batch_of_two_equals_the_batched_reference(fixtures_dir, name):
    """icefall pads a batch's features with log(1e-10), which reaches a shorter row's encoder output
    (results.json records by how much): the batched engine equals a batched reference, clip1 (the
    longest, unpadded) equals its single reference."""
    from oasr.decoding.transducer import transducer_greedy_search, transducer_modified_beam_search
    from oasr.engine import DecodingOptions, Engine

    from .conftest import results

    ref = refs(fixtures_dir, name)
    eng = Engine(engine_config(fixtures_dir, name, max_batch_size=2, schedule_policy="fcfs"))
    model = eng.model
    feats = torch.nn.utils.rnn.pad_sequence([ref[c]["fbank"] for c in CLIPS], batch_first=True)
    lens = torch.tensor([ref[c]["fbank"].shape[0] for c in CLIPS])
    with torch.no_grad():
        hidden, hidden_lens = model.encode_offline(feats, lens)
        enc = model.joiner.project_encoder(hidden)
        want_greedy = [h.tokens for h in transducer_greedy_search(model.predictor, model.joiner, enc, hidden_lens,
                                                                  blank_id=0)]
        want_beam = [n[0].tokens for n in transducer_modified_beam_search(model.predictor, model.joiner, enc,
                                                                          hidden_lens, blank_id=0, beam_size=4)]
    recorded = results(fixtures_dir, name)["batch2_encoder_max_abs_diff_vs_single"]
    for b, clip in enumerate(CLIPS):
        single = ref[clip]["encoder_out"]
        diff = float((hidden[b, : single.shape[0]] - single).abs().max())
        assert diff == pytest.approx(recorded[clip], abs=1e-3), clip
    assert want_greedy[1] == ref["clip1"]["greedy_search_batch_hyp"].tolist()
    assert want_beam[1] == ref["clip1"]["modified_beam_search_4_hyp"].tolist()
    audio = [_audio(fixtures_dir, clip) for clip in CLIPS]
    greedy = eng.transcribe_outputs(audio, sample_rate=16000)
    assert eng.metrics_snapshot()["max_batch_size"] == 2
    assert [o.tokens for o in greedy] == want_greedy
    beam = eng.transcribe_outputs(audio, sample_rate=16000, decoding=DecodingOptions(beam_size=4))
    assert [o.tokens for o in beam] == want_beam


def test_a_native_bundle_of_a_transducer_decodes_the_same(fixtures_dir, tmp_path):
    import oasr
    from oasr.checkpoints.native import save_native
    from oasr.engine import DecodingOptions, Engine, EngineConfig

    loaded = oasr.load_pretrained(release_dir(fixtures_dir, "zipformer_transducer"), architecture="transducer")
    bundle = save_native(loaded, tmp_path / "bundle")
    eng = Engine(EngineConfig(model=str(bundle)))
    assert eng.loaded.architecture == "transducer" and eng.loaded.config == loaded.config
    assert eng.loaded.decoding_defaults == loaded.decoding_defaults
    ref = refs(fixtures_dir, "zipformer_transducer")
    for clip in CLIPS:
        audio = _audio(fixtures_dir, clip)
        assert eng.transcribe_outputs(audio, sample_rate=16000).tokens == ref[clip]["greedy_search_batch_hyp"].tolist()
        beam = eng.transcribe_outputs(audio, sample_rate=16000, decoding=DecodingOptions(beam_size=4))
        assert beam.tokens == ref[clip]["modified_beam_search_4_hyp"].tolist()


def test_word_times_are_the_emission_frames_of_icefall_hypotheses(fixtures_dir):
    """Each word starts at its first piece's emission frame (4 feature frames = 40 ms per encoder frame)."""
    from oasr.decoding.transducer import transducer_greedy_search
    from oasr.engine import DecodingOptions, Engine, EngineConfig

    eng = Engine(EngineConfig(model=str(release_dir(fixtures_dir, "zipformer_transducer")), architecture="transducer"))
    decoder, joiner = predictor_and_joiner(fixtures_dir, "zipformer_transducer")
    for clip in CLIPS:
        ref = refs(fixtures_dir, "zipformer_transducer")[clip]
        enc, lens = _projected(joiner, [ref["encoder_out"]])
        with torch.no_grad():
            hyp, = transducer_greedy_search(decoder, joiner, enc, lens, blank_id=0)
        out = eng.transcribe_outputs(_audio(fixtures_dir, clip), sample_rate=16000,
                                     decoding=DecodingOptions(word_timestamps=True))
        assert out.tokens == hyp.tokens
        emissions = {round(f * 0.04, 3) for f in hyp.token_frames}
        assert len(out.words) > 5 and out.words[0].start == pytest.approx(hyp.token_frames[0] * 0.04)
        assert all(round(w.start, 3) in emissions for w in out.words)
        assert all(w.start <= w.end for w in out.words)


def test_audio_too_short_for_a_frame_decodes_to_nothing_beside_a_full_row(fixtures_dir):
    from oasr.engine import DecodingOptions, Engine

    eng = Engine(engine_config(fixtures_dir, "zipformer_transducer", max_batch_size=4, schedule_policy="fcfs"))
    ref = refs(fixtures_dir, "zipformer_transducer")["clip0"]
    audio = _audio(fixtures_dir, "clip0")
    for decoding, key in ((None, "greedy_search_batch_hyp"), (DecodingOptions(beam_size=4), "modified_beam_search_4_hyp")):
        outs = eng.transcribe_outputs([audio[:80], audio, audio[:800]], sample_rate=16000, decoding=decoding)
        assert [o.finish_reason for o in outs] == ["stop"] * 3
        assert outs[0].tokens == outs[2].tokens == [] and outs[1].tokens == ref[key].tolist()
    assert eng.metrics_snapshot()["max_batch_size"] == 3


def test_int8_quantizes_the_encoder_and_keeps_the_joiner_at_full_precision(fixtures_dir):
    from oasr import layers
    from oasr.engine import Engine

    eng = Engine(engine_config(fixtures_dir, "zipformer_transducer", quantization="int8"))
    linears = {name: m for name, m in eng.model.named_modules() if isinstance(m, layers.Linear)}
    joiner = [name for name in linears if name.startswith("joiner.")]
    assert len(joiner) == 3 and all(linears[name]._int8 is None for name in joiner)
    encoder = [name for name in linears if name.startswith("encoder.")]
    assert encoder and all(linears[name]._int8 is not None for name in encoder)
    out = eng.transcribe_outputs(_audio(fixtures_dir, "clip1"), sample_rate=16000)
    assert out.finish_reason == "stop" and out.tokens
