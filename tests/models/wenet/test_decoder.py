"""The attention decoder and WeNet's attention rescoring, against fixtures/wenet_u2pp."""

from __future__ import annotations

import math

import pytest
import torch

from oasr_models_wenet.decoder import _pad_hyps

from ._helpers import assert_rel, encode_ref
from .conftest import CLIPS, RUNS


def _nbest(ref: dict[str, torch.Tensor], run: str) -> list[list[int]]:
    return [[int(t) for t in row if t >= 0] for row in ref[f"{run}.prefix_nbest"]]


@pytest.mark.parametrize("run,chunk,left", RUNS)
@pytest.mark.parametrize("clip", CLIPS)
def test_teacher_forced_log_probs_match_wenet(model, refs, clip, run, chunk, left):
    ref = refs[clip]
    hidden, lens = encode_ref(model, ref["fbank"], chunk, left)
    hyps = _nbest(ref, run)
    dec = model.decoder
    inputs, _targets, hyp_lens = _pad_hyps(hyps, dec.sos_id, dec.eos_id, hidden.device, reverse=False)
    assert torch.equal(inputs, ref[f"{run}.decoder_in_hyps_sos"])
    r_inputs, _, _ = _pad_hyps(hyps, dec.sos_id, dec.eos_id, hidden.device, reverse=True)
    utterance = torch.zeros(len(hyps), dtype=torch.long)
    with torch.no_grad():
        left_lp = dec.teacher_forced_log_probs(hidden, lens, inputs, hyp_lens + 1, utterance)
        right_lp = dec.teacher_forced_log_probs(hidden, lens, r_inputs, hyp_lens + 1, utterance, right=True)
    assert_rel(left_lp, ref[f"{run}.decoder_log_probs"])
    assert_rel(right_lp, ref[f"{run}.r_decoder_log_probs"])


@pytest.mark.parametrize("run,chunk,left", RUNS)
@pytest.mark.parametrize("clip", CLIPS)
def test_attention_rescoring_matches_wenet(model, refs, results, clip, run, chunk, left):
    ref = refs[clip]
    expected = results["clips"][clip][run]["rescoring"]
    hidden, lens = encode_ref(model, ref["fbank"], chunk, left)
    hyps = _nbest(ref, run)
    with torch.no_grad():
        (scored,) = model.decoder.rescore(hidden, lens, [hyps], reverse_weight=results["reverse_weight"])
    ctc = ref[f"{run}.prefix_nbest_scores"]
    totals = scored.scores + (ctc * results["ctc_weight"]).float()
    best = int(totals.argmax())
    assert hyps[best] == expected["tokens"] == ref[f"{run}.rescoring_hyp"].tolist()
    assert float(totals[best]) == pytest.approx(expected["score"], rel=1e-5)
    confidence = math.exp(float(scored.scores[best]) / (len(hyps[best]) + 1))
    assert confidence == pytest.approx(expected["confidence"], rel=1e-4)
    assert len(scored.token_confidences[best]) == len(hyps[best])


def test_rescore_batches_utterances_and_equals_one_at_a_time(model, refs):
    """One pass over every hypothesis of every utterance equals per-utterance passes."""
    encoded = [encode_ref(model, refs[c]["fbank"], -1, -1) for c in CLIPS]
    hyps = [_nbest(refs[c], "offline") for c in CLIPS]
    width = max(h.size(1) for h, _ in encoded)
    memory = torch.cat([torch.nn.functional.pad(h, (0, 0, 0, width - h.size(1))) for h, _ in encoded])
    lens = torch.cat([n for _, n in encoded])
    with torch.no_grad():
        together = model.decoder.rescore(memory, lens, hyps)
        alone = [model.decoder.rescore(h, n, [hy])[0] for (h, n), hy in zip(encoded, hyps, strict=True)]
    for a, b in zip(together, alone, strict=True):
        assert_rel(a.scores, b.scores, 1e-5)


def test_rescore_reverse_weight_defaults_to_the_trained_one(model, refs, results):
    assert model.decoder.config.reverse_weight == results["reverse_weight"]
    hidden, lens = encode_ref(model, refs["clip0"]["fbank"], -1, -1)
    hyps = [_nbest(refs["clip0"], "offline")]
    with torch.no_grad():
        default = model.decoder.rescore(hidden, lens, hyps)[0].scores
        explicit = model.decoder.rescore(hidden, lens, hyps, reverse_weight=results["reverse_weight"])[0].scores
        left_only = model.decoder.rescore(hidden, lens, hyps, reverse_weight=0.0)[0].scores
    assert torch.equal(default, explicit)
    assert not torch.allclose(default, left_only)


def test_rescore_handles_an_empty_hypothesis(model, refs):
    hidden, lens = encode_ref(model, refs["clip0"]["fbank"], -1, -1)
    with torch.no_grad():
        (scored,) = model.decoder.rescore(hidden, lens, [[[], [33, 42]]])
        inputs = torch.tensor([[model.decoder.sos_id]])
        lp = model.decoder.teacher_forced_log_probs(hidden, lens, inputs, torch.tensor([1]), torch.tensor([0]))
        r_lp = model.decoder.teacher_forced_log_probs(hidden, lens, inputs, torch.tensor([1]), torch.tensor([0]),
                                                      right=True)
    eos = model.decoder.eos_id
    rw = model.decoder.config.reverse_weight
    assert float(scored.scores[0]) == pytest.approx(float(lp[0, 0, eos] * (1 - rw) + r_lp[0, 0, eos] * rw), rel=1e-6)
    assert scored.token_confidences[0] == []
