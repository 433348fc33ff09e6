"""The ``ctc_aed_rescoring`` decode strategy against WeNet's attention_rescoring (fixtures/wenet_u2pp)."""

from __future__ import annotations

import pytest
import torch
from torch.nn.utils.rnn import pad_sequence

import oasr
from oasr import plugins
from oasr.decoding.strategy import DecodeBatch, DecodeContext
from oasr.engine.options import DecodingOptions
from oasr.errors import CapabilityError, ConfigError, RequestError
from oasr_models_wenet.decode import CtcAedRescoringOptions, CtcAedRescoringStrategy

from .conftest import CLIPS


def _context(loaded) -> DecodeContext:
    return DecodeContext(model=loaded.model, tokenizer=None, decoding_defaults=loaded.decoding_defaults,
                         feature_config=None, device=torch.device("cpu"), frame_shift=0.01)


def _batch(refs, options: list[DecodingOptions] | None = None) -> DecodeBatch:
    feats = [refs[c]["fbank"] for c in CLIPS]
    return DecodeBatch(request_ids=list(CLIPS), options=options or [DecodingOptions() for _ in CLIPS],
                       waveforms=[refs[c]["wav_int16"].float() / 32768 for c in CLIPS],
                       feats=pad_sequence(feats, batch_first=True), feat_lens=torch.tensor([f.size(0) for f in feats]))


def test_registered_through_the_decoders_hook():
    entry = plugins.registry("decoders").get("ctc_aed_rescoring")
    assert entry.load() is CtcAedRescoringStrategy
    assert entry.distribution == "oasr-models-wenet"


def test_rescoring_a_padded_batch_matches_wenet(loaded, refs, results):
    strategy = CtcAedRescoringStrategy(_context(loaded))
    assert (strategy.beam_size, strategy.ctc_weight, strategy.reverse_weight) == (
        results["beam"], results["ctc_weight"], results["reverse_weight"])
    hyps = strategy.decode(_batch(refs))
    for hyp, clip in zip(hyps, CLIPS, strict=True):
        expected = results["clips"][clip]["offline"]
        assert hyp.tokens == expected["rescoring"]["tokens"] == results["clips"][clip]["offline_api"]["attention_rescoring"]
        assert hyp.score == pytest.approx(expected["rescoring"]["score"], rel=1e-5)
        assert hyp.confidence == pytest.approx(expected["rescoring"]["confidence"], rel=1e-4)
        best = expected["prefix_nbest"].index(hyp.tokens)
        assert hyp.token_frames == expected["prefix_nbest_times"][best]
        assert hyp.token_times == pytest.approx([0.04 * f for f in hyp.token_frames])
        assert len(hyp.token_confidences) == len(hyp.tokens)


def test_n_best_and_per_request_beam(loaded, refs, results):
    strategy = CtcAedRescoringStrategy(_context(loaded))
    hyps = strategy.decode(_batch(refs, [DecodingOptions(n_best=3), DecodingOptions(beam_size=1)]))
    assert [h.tokens for h in hyps[0].nbest][0] == hyps[0].tokens
    assert len(hyps[0].nbest) == 3 and hyps[0].nbest[0].score >= hyps[0].nbest[1].score >= hyps[0].nbest[2].score
    assert {tuple(h.tokens) for h in hyps[0].nbest} <= {tuple(h) for h in results["clips"]["clip0"]["offline"]["prefix_nbest"]}
    # beam 1: the single CTC prefix hypothesis is the answer
    assert hyps[1].tokens == results["clips"]["clip1"]["offline"]["ctc_greedy"]


def test_engine_options_override_the_checkpoint_defaults(loaded, refs):
    options = CtcAedRescoringStrategy.parse_options({"beam_size": 4, "ctc_weight": 0.1, "reverse_weight": 0.0})
    strategy = CtcAedRescoringStrategy(_context(loaded), options)
    assert (strategy.beam_size, strategy.ctc_weight, strategy.reverse_weight) == (4, 0.1, 0.0)
    with pytest.raises(ConfigError, match="beam"):
        CtcAedRescoringStrategy.parse_options({"beams": 4})
    with pytest.raises(ValueError):
        CtcAedRescoringOptions(ctc_weight=-1.0)


def test_requests_asking_for_what_it_cannot_do_are_refused(loaded):
    strategy = CtcAedRescoringStrategy(_context(loaded))
    strategy.validate(DecodingOptions(beam_size=4, n_best=2))
    with pytest.raises(RequestError, match="word_timestamps"):
        strategy.validate(DecodingOptions(word_timestamps=True))
    with pytest.raises(RequestError, match="n_best"):
        strategy.validate(DecodingOptions(beam_size=2, n_best=3))


def test_a_checkpoint_without_decoder_cannot_build_it(wenet_copy, loaded):
    (wenet_copy / "train.yaml").write_text((wenet_copy / "train.yaml").read_text().replace(
        "decoder: bitransformer", "decoder: null"))
    with pytest.warns(RuntimeWarning, match="ctc_aed_rescoring"):
        ctc_only = oasr.load_pretrained(wenet_copy)
    ctx = DecodeContext(model=ctc_only.model, tokenizer=None, decoding_defaults=ctc_only.decoding_defaults,
                        feature_config=None, device=torch.device("cpu"))
    with pytest.raises(CapabilityError, match="ctc_aed_rescoring"):
        CtcAedRescoringStrategy(ctx)
