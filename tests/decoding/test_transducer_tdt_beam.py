"""TDT beam search (:mod:`oasr.decoding.tdt_beam`, :mod:`oasr.decoding.tdt_maes`) against NeMo's own
``BeamTDTInfer`` (``search_type`` ``"default"`` and ``"maes"``) on tiny random LSTM-predictor TDT heads: every
kept hypothesis (labels in n-best order, scores), for several duration sets and beams, batched rows against
each row alone.

NeMo's modules get the very weights of our toys (its ``RNNTDecoder`` / ``RNNTJoint`` state dicts, loaded
strictly) and the same encoder frames.  Near-ties: a clip whose n-best changes when our joint's head is
perturbed by a few 1e-5 (far above the two implementations' float32 noise) sits on a near-tie and is not
compared; most clips must be compared, and a search with a broken rule must fail the comparison.
"""

from __future__ import annotations

import pytest
import torch

from oasr.decoding import tdt_beam
from oasr.decoding.tdt_beam import TdtBeamRows
from oasr.decoding.tdt_search import tdt_beam_rows, tdt_beam_search
from oasr.errors import ConfigError
from tests.decoding._tdt_beam_oracle import lstm_joint_spec, nbest_mismatch, run_nemo_tdt_beam
from tests.decoding._transducer_toys import LstmPredictor, ToyJoiner

pytestmark = pytest.mark.reference

torch.set_num_threads(1)
VOCAB, BLANK = 12, 11  # NeMo's blank is its last id
LENGTHS = [30, 17, 24, 9]
#: (name, durations, seed, blank bias, head scale): durations with 0 (labels stay at the frame), without,
#: and a wide one
CASES = [("d01234", (0, 1, 2, 3, 4), 1, 0.5, 0.4), ("d0124", (0, 1, 2, 4), 2, 2.0, 0.5),
         ("d123", (1, 2, 3), 3, 0.0, 0.4)]
BEAMS = (1, 2, 4)
SEARCHES = ("default", "maes")
PERTURB = 3e-5


def toy(durations, seed: int, blank_bias: float, head_scale: float):
    pred = LstmPredictor(VOCAB, dim=8, blank_id=BLANK, seed=40 + seed)
    joiner = ToyJoiner(6, 8, VOCAB, joiner_dim=16, durations=durations, seed=50 + seed)
    with torch.no_grad():
        pred.embedding.weight[BLANK].zero_()  # NeMo's blank is its embedding's zero padding row
        joiner.out.weight.mul_(head_scale)
        joiner.out.bias[BLANK] += blank_bias
    return pred.eval(), joiner.eval()


def hidden_of(seed: int) -> torch.Tensor:
    return torch.randn(len(LENGTHS), max(LENGTHS), 6, generator=torch.Generator().manual_seed(60 + seed))


def spec_of(pred, joiner, hidden) -> dict:
    cell = pred.cell
    return lstm_joint_spec(pred.embedding.weight, [(cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh)],
                           (joiner.enc.weight, joiner.enc.bias), (joiner.pred.weight, joiner.pred.bias),
                           (joiner.out.weight, joiner.out.bias), activation="tanh", durations=joiner.durations,
                           encoder=[hidden[b, :n] for b, n in enumerate(LENGTHS)])


def ours_all(pred, joiner, hidden, beam: int, search: str = "default") -> list[list]:
    """Every kept hypothesis per row (best first), the rows searched as one batch."""
    with torch.no_grad():
        enc = joiner.project_encoder(hidden)
        rows = tdt_beam_rows(pred, joiner, len(LENGTHS), "cpu", blank_id=BLANK, beam_size=beam, search=search)
        for t in range(max(LENGTHS)):
            active = [b for b, n in enumerate(LENGTHS) if n > t]
            rows.step(enc[active, t], active)
    return [rows.results(b) for b in range(len(LENGTHS))]


def perturbed(joiner, seed: int):
    other = ToyJoiner(6, 8, VOCAB, joiner_dim=16, durations=joiner.durations)
    other.load_state_dict(joiner.state_dict())
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        other.out.weight.add_(torch.randn(other.out.weight.shape, generator=g) * PERTURB)
        other.out.bias.add_(torch.randn(other.out.bias.shape, generator=g) * PERTURB)
    return other.eval()


@pytest.fixture(scope="module")
def nemo(tmp_path_factory) -> dict:
    """NeMo's n-best lists per case: {case name: {"default/beam": [per clip]}}, one NeMo process for all."""
    specs = {}
    for name, durations, seed, bias, scale in CASES:
        pred, joiner = toy(durations, seed, bias, scale)
        specs[name] = dict(spec_of(pred, joiner, hidden_of(seed)), runs=[[s, b] for s in SEARCHES for b in BEAMS])
    return run_nemo_tdt_beam(specs, tmp_path_factory.mktemp("tdt_beam"))


def compare(nemo, search_type: str = "default") -> tuple[int, int, list[str]]:
    """(clips compared, clips in all, mismatches) over every case and beam of one NeMo search type."""

    def search(pred, joiner, hidden, beam):
        return ours_all(pred, joiner, hidden, beam, search_type)

    compared, total, failures = 0, 0, []
    for name, durations, seed, bias, scale in CASES:
        pred, joiner = toy(durations, seed, bias, scale)
        hidden = hidden_of(seed)
        for beam in BEAMS:
            ours = search(pred, joiner, hidden, beam)
            shaken = [search(pred, perturbed(joiner, s), hidden, beam) for s in (1, 2)]
            for b, theirs in enumerate(nemo[name][f"{search_type}/{beam}"]):
                total += 1
                tokens = [h.tokens for h in ours[b]]
                if any([h.tokens for h in other[b]] != tokens for other in shaken):
                    continue  # a near-tie: the n-best moves under a perturbation far above float noise
                compared += 1
                why = nbest_mismatch(ours[b], theirs)
                if why:
                    failures.append(f"{name} beam {beam} clip {b}: {why}")
    return compared, total, failures


@pytest.mark.parametrize("search_type", SEARCHES)
def test_every_kept_hypothesis_equals_nemo_beam_tdt_infer(nemo, search_type):
    compared, total, failures = compare(nemo, search_type)
    assert not failures, "\n".join(failures)
    assert compared >= 0.8 * total, f"only {compared} of {total} clips were clear of near-ties"
    # the cases exercise the search: several labels, several hypotheses, different n-best lists
    lists = [clip for case in nemo.values() for key, clips in case.items() if key.startswith(search_type)
             for clip in clips]
    assert sum(len(clip[0]["tokens"]) for clip in lists) >= 5 * len(lists)
    assert sum(len(clip) > 1 for clip in lists) >= 0.5 * len(lists)


def test_a_broken_rule_fails_the_comparison(nemo, monkeypatch):
    """The test of the test: a search that never merges duplicates is caught on clips clear of near-ties, and
    so is an mAES that ignores its prefix search."""
    from oasr.decoding import tdt_maes

    with monkeypatch.context() as patch:
        patch.setattr(tdt_beam, "_merge", lambda hyps: list(hyps))
        compared, _, failures = compare(nemo)
        assert compared > 0 and failures
    monkeypatch.setattr(tdt_maes.TdtMaesRows, "_prefix_search", lambda self, hyps, enc: hyps)
    compared, _, failures = compare(nemo, "maes")
    assert compared > 0 and failures


def test_n_best_is_the_head_of_the_kept_list_and_batched_equals_alone():
    name, durations, seed, bias, scale = CASES[0]
    pred, joiner = toy(durations, seed, bias, scale)
    hidden = hidden_of(seed)
    full = ours_all(pred, joiner, hidden, 4)
    with torch.no_grad():
        enc = joiner.project_encoder(hidden)
        batched = tdt_beam_search(pred, joiner, enc, LENGTHS, blank_id=BLANK, beam_size=4, n_best=3)
        for b, n in enumerate(LENGTHS):
            alone = tdt_beam_search(pred, joiner, enc[b:b + 1, :n], [n], blank_id=BLANK, beam_size=4, n_best=3)
            assert [h.tokens for h in alone[0]] == [h.tokens for h in batched[b]]
            assert [h.score for h in alone[0]] == pytest.approx([h.score for h in batched[b]], abs=1e-5)
    for b in range(len(LENGTHS)):
        assert [h.tokens for h in batched[b]] == [h.tokens for h in full[b][:3]]
        for h in batched[b]:
            assert len(h.token_frames) == len(h.tokens) == len(h.token_confidences)
            assert h.token_frames == sorted(h.token_frames) and all(0 <= f < LENGTHS[b] for f in h.token_frames)
            assert all(0.0 < c <= 1.0 for c in h.token_confidences)


def test_refusals_name_the_problem():
    pred, joiner = toy((0, 1, 2), 1, 0.0, 1.0)
    with pytest.raises(ConfigError, match="beam_size must be at least 1"):
        TdtBeamRows(pred, joiner, 1, "cpu", blank_id=BLANK, beam_size=0)
    rnnt = ToyJoiner(6, 8, VOCAB)
    with pytest.raises(ConfigError, match="duration logits"):
        TdtBeamRows(pred, rnnt, 1, "cpu", blank_id=BLANK)
    zero_only = ToyJoiner(6, 8, VOCAB, durations=(0,))
    with pytest.raises(ConfigError, match="no non-zero duration"):
        TdtBeamRows(pred, zero_only, 1, "cpu", blank_id=BLANK)
    with pytest.raises(ConfigError, match="n_best"):
        tdt_beam_search(pred, joiner, torch.zeros(1, 2, 16), [2], blank_id=BLANK, beam_size=2, n_best=3)
    with pytest.raises(ConfigError, match="'default' or 'maes'"):
        tdt_beam_rows(pred, joiner, 1, "cpu", blank_id=BLANK, search="tsd")
    with pytest.raises(ConfigError, match="beam_size \\+ expansion_beta = 13"):
        tdt_beam_search(pred, joiner, torch.zeros(1, 2, 16), [2], blank_id=BLANK, beam_size=11, search="maes")
