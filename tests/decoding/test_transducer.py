"""The core ``transducer`` decode family: searches against independent per-utterance oracles written
here from icefall's ``beam_search.py`` (``greedy_search``, ``modified_beam_search``), an exhaustive
enumeration of alignments, constructed joints for timings and TDT durations, streaming against
offline, and the refusals."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from oasr.decoding.context import ContextGraph
from oasr.decoding.strategy import DecodeBatch, DecodeContext
from oasr.decoding.transducer import (
    BeamRows,
    GreedyRows,
    transducer_greedy_search,
    transducer_modified_beam_search,
)
from oasr.decoding.transducer_strategy import TransducerDecodeStrategy, TransducerOptions
from oasr.engine.options import DecodingOptions
from oasr.errors import ConfigError, RequestError
from oasr.models.specs import DecodingDefaults
from oasr.models.transducer import TransducerJoiner, TransducerPredictor
from tests.decoding._transducer_toys import (
    LstmPredictor,
    ToyJoiner,
    ToyTransducerConfig,
    ToyTransducerModel,
    WindowPredictor,
)

torch.set_num_threads(1)
F64 = torch.float64


# -- oracles (plain, unbatched, written from icefall's description) -------------------------------------
def oracle_greedy(pred, joiner, hidden, max_sym, blank=0, unk=None, recurrent=False):
    """icefall greedy_search for one utterance: hidden (T, D).  Returns (tokens, frames, min top-2 gap)."""
    ctx = getattr(pred, "context_size", 1)
    window = [-1] * (ctx - 1) + [blank]
    if recurrent:
        h, c = pred.cell_step(None, *[hidden.new_zeros(1, 8)] * 2)
        dec = h
    else:
        dec = pred.decoder_out(torch.tensor([window]))
    tokens, frames, gap = [], [], math.inf
    t, sym = 0, 0
    while t < hidden.shape[0]:
        if sym >= max_sym:
            sym, t = 0, t + 1
            continue
        logits = joiner.logits(hidden[t], dec)
        top = torch.topk(logits, 2).values
        gap = min(gap, float(top[0] - top[1]))
        y = int(logits.argmax())
        if y != blank and y != unk:
            tokens.append(y)
            frames.append(t)
            if recurrent:
                h, c = pred.cell_step(y, h, c)
                dec = h
            else:
                window = (window + [y])[-ctx:]
                dec = pred.decoder_out(torch.tensor([window]))
            sym += 1
        else:
            sym, t = 0, t + 1
    return tokens, frames, gap


def oracle_beam(pred, joiner, hidden, beam, blank=0):
    """icefall modified_beam_search for one utterance (one symbol per frame, label sequences merged by
    logaddexp, the first kept candidate's frames, best by log_prob / len(ys) with the start window in ys).
    Returns {labels: (log_prob, frames)} and the best labels, plus the smallest margin at a pruning cut."""
    ctx = pred.context_size
    hyps = {tuple([-1] * (ctx - 1) + [blank]): (torch.zeros((), dtype=torch.float32), [])}
    margin = math.inf
    for t in range(hidden.shape[0]):
        items = list(hyps.items())
        dec = pred.decoder_out(torch.tensor([list(ys[-ctx:]) for ys, _ in items]))
        logits = joiner.out(torch.tanh(joiner.enc(hidden[t]) + joiner.pred(dec)))
        vocab = logits.shape[-1]
        scores = logits.float().log_softmax(-1) + torch.stack([s for _, (s, _) in items])[:, None]
        flat = scores.reshape(-1)
        order = torch.sort(flat, descending=True, stable=True).indices
        if order.numel() > beam:
            margin = min(margin, float(flat[order[beam - 1]] - flat[order[beam]]))
        new = {}
        for k in order[:beam].tolist():
            h, token = divmod(k, vocab)
            ys, (_, frames) = items[h]
            if token != blank:
                ys, frames = ys + (token,), frames + [t]
            if ys in new:
                new[ys] = (torch.logaddexp(new[ys][0], flat[k]), new[ys][1])
            else:
                new[ys] = (flat[k], frames)
        hyps = new
    ranked = sorted(hyps.items(), key=lambda kv: float(kv[1][0]) / len(kv[0]), reverse=True)
    return {ys[ctx:]: (float(s), f) for ys, (s, f) in hyps.items()}, ranked[0][0][ctx:], margin


def exhaustive(pred, joiner, hidden, blank=0):
    """log P(labels) for every label sequence, summing over every alignment with one symbol or blank per frame."""
    ctx = pred.context_size
    frames, vocab = hidden.shape[0], joiner.out.out_features
    out: dict[tuple, list[float]] = {}
    for path in itertools.product(range(vocab), repeat=frames):
        window, labels, total = [-1] * (ctx - 1) + [blank], (), 0.0
        for t, y in enumerate(path):
            dec = pred.decoder_out(torch.tensor([window[-ctx:]]))
            total += float(joiner.logits(hidden[t], dec).double().log_softmax(-1)[y])
            if y != blank:
                labels += (y,)
                window = window + [y]
        out.setdefault(labels, []).append(total)
    return {k: max(v) + math.log(math.fsum(math.exp(x - max(v)) for x in v)) for k, v in out.items()}


# -- fixtures ---------------------------------------------------------------------------------------
def toy(vocab=7, seed=0, dtype=F64, blank_bias=2.0, durations=()):
    pred = WindowPredictor(vocab, dim=8, context_size=2, seed=10 + seed, dtype=dtype)
    joiner = ToyJoiner(6, 8, vocab, seed=20 + seed, durations=durations, dtype=dtype)
    with torch.no_grad():
        joiner.out.bias[0] += blank_bias
    return pred, joiner


def frames_of(seed, batch, frames, dim=6, dtype=F64):
    return torch.randn(batch, frames, dim, generator=torch.Generator().manual_seed(seed), dtype=dtype)


LENGTHS = [13, 6, 10, 1]


def test_toys_satisfy_the_protocols():
    pred, joiner = toy()
    assert isinstance(pred, TransducerPredictor) and isinstance(joiner, TransducerJoiner)
    assert isinstance(LstmPredictor(7), TransducerPredictor)


# -- greedy -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("max_symbols", [1, 3])
@pytest.mark.parametrize("recurrent", [False, True])
def test_greedy_equals_icefall_greedy_search_per_utterance_and_batched_equals_alone(max_symbols, recurrent):
    pred, joiner = toy(seed=1)
    if recurrent:
        pred = LstmPredictor(7, dim=8, seed=11).double()
    hidden = frames_of(3, len(LENGTHS), max(LENGTHS))
    with torch.no_grad():
        enc = joiner.project_encoder(hidden)
        batched = transducer_greedy_search(pred, joiner, enc, LENGTHS, blank_id=0, max_symbols=max_symbols)
        emitted = 0
        for b, n in enumerate(LENGTHS):
            tokens, frames, gap = oracle_greedy(pred, joiner, hidden[b, :n], max_symbols, recurrent=recurrent)
            assert gap > 1e-6  # float64 noise is ~1e-15: no decision here is a near-tie
            assert batched[b].tokens == tokens and batched[b].token_frames == frames
            alone = transducer_greedy_search(pred, joiner, enc[b:b + 1, :n], [n], blank_id=0, max_symbols=max_symbols)
            assert alone[0].tokens == tokens and alone[0].token_frames == frames
            assert alone[0].score == pytest.approx(batched[b].score, abs=1e-9)
            emitted += len(tokens)
            if max_symbols > 1:
                assert all(frames.count(f) <= max_symbols for f in frames)
    assert emitted >= 10 and len({t for h in batched for t in h.tokens}) >= 3  # tokens vary
    if max_symbols == 3:
        assert any(batched[b].token_frames.count(f) > 1 for b in range(len(LENGTHS)) for f in batched[b].token_frames)


def test_unk_is_never_emitted_and_treated_like_blank():
    pred, joiner = toy(seed=1)
    hidden = frames_of(3, 1, 13)
    with torch.no_grad():
        enc = joiner.project_encoder(hidden)
        plain = transducer_greedy_search(pred, joiner, enc, [13], blank_id=0)[0]
        unk = max(set(plain.tokens), key=plain.tokens.count)
        got = transducer_greedy_search(pred, joiner, enc, [13], blank_id=0, unk_id=unk)[0]
        tokens, frames, _ = oracle_greedy(pred, joiner, hidden[0], 1, unk=unk)
    assert unk not in got.tokens and got.tokens == tokens and got.token_frames == frames
    assert got.tokens != plain.tokens


# -- modified beam search ------------------------------------------------------------------------------
def test_modified_beam_equals_icefall_modified_beam_search_per_utterance():
    pred, joiner = toy(seed=5, blank_bias=2.0)  # seed 5: three of the four rows' beam result differs from greedy
    hidden = frames_of(4, len(LENGTHS), max(LENGTHS))
    with torch.no_grad():
        enc = joiner.project_encoder(hidden)
        nbests = transducer_modified_beam_search(pred, joiner, enc, LENGTHS, blank_id=0, beam_size=4, n_best=4)
        greedy = transducer_greedy_search(pred, joiner, enc, LENGTHS, blank_id=0)
        differs = 0
        for b, n in enumerate(LENGTHS):
            hyps, best, margin = oracle_beam(pred, joiner, hidden[b, :n], 4)
            assert margin > 1e-5
            assert nbests[b][0].tokens == list(best)
            assert {tuple(h.tokens) for h in nbests[b]} == set(hyps)
            for h in nbests[b]:
                score, frames = hyps[tuple(h.tokens)]
                assert h.score == pytest.approx(score, abs=1e-4) and h.token_frames == frames
            alone = transducer_modified_beam_search(pred, joiner, enc[b:b + 1, :n], [n], blank_id=0, beam_size=4,
                                                    n_best=4)[0]
            assert [h.tokens for h in alone] == [h.tokens for h in nbests[b]]
            differs += nbests[b][0].tokens != greedy[b].tokens
    assert differs >= 1  # the beam finds something greedy does not


def test_exact_beam_matches_exhaustive_alignment_sums():
    pred, joiner = toy(vocab=3, seed=4, blank_bias=0.0)
    hidden = frames_of(5, 1, 3)
    with torch.no_grad():
        exact = exhaustive(pred, joiner, hidden[0])
        # beam 21 >= every (hypothesis x vocab) candidate of 3 frames: nothing is pruned
        nbest = transducer_modified_beam_search(pred, joiner, joiner.project_encoder(hidden), [3], blank_id=0,
                                                beam_size=21, n_best=15)[0]
    assert len(exact) == 15 and {tuple(h.tokens) for h in nbest} == set(exact)
    for h in nbest:
        assert h.score == pytest.approx(exact[tuple(h.tokens)], abs=2e-5)
    # icefall's length normalization counts the start window (2 labels here) in len(ys)
    norm = {k: v / (len(k) + 2) for k, v in exact.items()}
    ranked = sorted(exact, key=norm.get, reverse=True)
    assert min(norm[a] - norm[b] for a, b in itertools.pairwise(ranked)) > 1e-4
    assert ranked != sorted(exact, key=lambda k: exact[k] / (len(k) + 1), reverse=True)  # the window matters
    assert [tuple(h.tokens) for h in nbest] == ranked


def _hotword_case():
    """A tiny exact case, the exhaustive scores, the baseline best and a 2-token phrase not in it."""
    pred, joiner = toy(vocab=3, seed=3, blank_bias=0.5)
    hidden = frames_of(5, 1, 3)
    with torch.no_grad():
        exact = exhaustive(pred, joiner, hidden[0])
    baseline = max(exact, key=lambda k: exact[k] / (len(k) + 2))
    phrase = next(p for p in ((1, 2), (2, 1)) if not _contains(baseline, p))
    return pred, joiner, hidden, exact, baseline, phrase


def _contains(labels, phrase):
    return any(tuple(labels[i:i + len(phrase)]) == phrase for i in range(len(labels) - len(phrase) + 1))


def _predicted(exact, phrase, bonus):
    """With a completed phrase worth len(phrase) x bonus and partial matches given back, the search's
    scores are exhaustive + that; the best by icefall's length normalization."""
    scored = {k: v + (len(phrase) * bonus if _contains(k, phrase) else 0.0) for k, v in exact.items()}
    ranked = sorted(scored, key=lambda k: scored[k] / (len(k) + 2), reverse=True)
    gap = scored[ranked[0]] / (len(ranked[0]) + 2) - scored[ranked[1]] / (len(ranked[1]) + 2)
    return scored, ranked[0], gap


def test_hotwords_flip_the_best_exactly_as_exhaustive_scoring_predicts():
    pred, joiner, hidden, exact, baseline, phrase = _hotword_case()
    grid = [round(0.05 * i, 2) for i in range(1, 400)]
    flip = next(s for s in grid if _predicted(exact, phrase, s)[1] != baseline)
    small, big = flip / 2, flip + 0.5
    for bonus, should_flip in ((small, False), (big, True)):
        scored, best, gap = _predicted(exact, phrase, bonus)
        assert gap > 1e-3 and (best != baseline) == should_flip
        with torch.no_grad():
            nbest = transducer_modified_beam_search(pred, joiner, joiner.project_encoder(hidden), [3], blank_id=0,
                                                    beam_size=21, n_best=15,
                                                    context=ContextGraph([list(phrase)], score=bonus))[0]
        assert tuple(nbest[0].tokens) == best
        for h in nbest:
            assert h.score == pytest.approx(scored[tuple(h.tokens)], abs=2e-5)
    assert _contains(best, phrase)


# -- timings, confidences, words, TDT ---------------------------------------------------------------
class ScriptedPredictor(WindowPredictor):
    """A label window whose output the scripted joiner ignores."""


class ScriptedJoiner(torch.nn.Module):
    """The "encoder frame" is the logits row itself; the predictor adds nothing."""

    def __init__(self, vocab, durations=()):
        super().__init__()
        self.vocab = vocab
        self.durations = tuple(durations)

    def project_encoder(self, hidden):
        return hidden

    def project_predictor(self, pred):
        return pred.new_zeros(pred.shape[0], self.vocab + len(self.durations))

    def joint(self, enc_proj, pred_proj):
        return enc_proj + pred_proj


def scripted_rows(rows, vocab, durations=()):
    """Logit rows: (token, logit) per frame (token None: blank at 4), with an optional duration index."""
    out = torch.zeros(len(rows), vocab + len(durations))
    for t, row in enumerate(rows):
        token, value = row[0], row[1]
        out[t, 0 if token is None else token] = value
        if durations:
            out[t, vocab + row[2]] = 5.0
    return out


class CharTokenizer:
    """Token i is the piece ``PIECES[i]``; encode maps characters back."""

    PIECES = {0: "", 1: " a", 2: " e", 3: " b", 4: "c", 5: " d", 6: "f"}
    special_ids = frozenset({0})

    def token_pieces(self, ids):
        return [self.PIECES[i] for i in ids]

    def decode(self, ids):
        return "".join(self.PIECES[i] for i in ids).strip()

    def encode(self, text):
        inverse = {v.strip(): k for k, v in self.PIECES.items() if v.strip()}
        return [inverse[ch] for ch in text if ch != " "]


def strategy_for(model, options=None, defaults=None, frame_shift=0.04):
    ctx = DecodeContext(model=model, tokenizer=CharTokenizer(),
                        decoding_defaults=defaults or DecodingDefaults(decode_type="transducer", blank_id=0),
                        feature_config=None, device=torch.device("cpu"), frame_shift=frame_shift)
    return TransducerDecodeStrategy(ctx, options)


class ScriptedModel(ToyTransducerModel):
    def __init__(self, durations=()):
        super().__init__(ToyTransducerConfig(feat_dim=7 + len(durations), vocab=7))
        self.predictor = WindowPredictor(7, dim=8, context_size=2)
        self.joiner = ScriptedJoiner(7, durations)

    def encode_offline(self, feats, feat_lens):
        return feats, feat_lens


def test_token_frames_times_confidences_and_words_on_a_constructed_case():
    rows = [(3, 5.0), (None, 4.0), (4, 3.0), (5, 2.0), (None, 1.0), (1, 6.0)]
    logits = scripted_rows(rows, 7)
    strategy = strategy_for(ScriptedModel())
    hyp = strategy.decode(DecodeBatch(["r"], [DecodingOptions(word_timestamps=True)], [torch.zeros(1)],
                                      feats=logits[None], feat_lens=torch.tensor([6])))[0]
    assert hyp.tokens == [3, 4, 5, 1] and hyp.token_frames == [0, 2, 3, 5]
    assert hyp.token_times == [0.0, 0.08, 0.12, 0.2]
    expected = [math.exp(v) / (math.exp(v) + 6) for v in (5.0, 3.0, 2.0, 6.0)]
    assert hyp.token_confidences == pytest.approx(expected, rel=1e-6)
    assert hyp.confidence == pytest.approx(math.prod(expected) ** 0.25, rel=1e-6)
    assert [(w.word, round(w.start, 6), round(w.end, 6)) for w in hyp.words] == [
        ("bc", 0.0, 0.12), ("d", 0.12, 0.16), ("a", 0.2, 0.24)]
    assert hyp.words[0].confidence == pytest.approx((expected[0] + expected[1]) / 2)
    # two labels per frame at most: the scripted joint (blind to the labels) emits each token twice
    twice = strategy_for(ScriptedModel(), TransducerOptions(max_symbols=2))
    hyp = twice.decode(DecodeBatch(["r"], [DecodingOptions()], [torch.zeros(1)], feats=logits[None],
                                   feat_lens=torch.tensor([6])))[0]
    assert hyp.tokens == [3, 3, 4, 4, 5, 5, 1, 1] and hyp.token_frames == [0, 0, 2, 2, 3, 3, 5, 5]


TDT_ROWS = [(3, 5.0, 2), (6, 4.0, 0), (None, 3.0, 0), (5, 4.0, 0), (1, 3.0, 3), (2, 3.0, 1), (2, 3.0, 1),
            (4, 2.0, 1), (None, 2.0, 1)]


def test_tdt_greedy_advances_by_the_argmax_duration():
    # frame 0: token 3, jump 2 (frame 1 skipped); frame 2: blank with duration 0 counts as 1; frame 3:
    # token 5, duration 0, again token 5 -> the second label at one frame (max_symbols 2) forces a step;
    # frame 4: token 1, jump 3 (frames 5, 6 skipped); frame 7: token 4; frame 8: blank
    strategy = strategy_for(ScriptedModel(durations=(0, 1, 2, 3)), TransducerOptions(max_symbols=2))
    logits = scripted_rows(TDT_ROWS, 7, durations=(0, 1, 2, 3))
    hyp = strategy.decode(DecodeBatch(["r"], [DecodingOptions()], [torch.zeros(1)], feats=logits[None],
                                      feat_lens=torch.tensor([9])))[0]
    assert hyp.tokens == [3, 5, 5, 1, 4] and hyp.token_frames == [0, 3, 3, 4, 7]


def oracle_tdt(pred, joiner, hidden, durations, max_sym, blank=0):
    """NeMo's TDT greedy for one utterance, as a plain loop: token argmax and duration argmax per joint;
    a blank's duration 0 counts as 1; the max_sym-th label at one frame forces a step of 1.  Also returns
    every decision's (token log-probability, emitted) in order, blanks included."""
    window = [-1, blank]
    dec = pred.decoder_out(torch.tensor([window]))
    tokens, frames, gap, decisions = [], [], math.inf, []
    t, sym, vocab = 0, 0, joiner.out.out_features - len(durations)
    while t < hidden.shape[0]:
        logits = joiner.logits(hidden[t], dec)
        for part in (logits[:vocab], logits[vocab:]):
            top = torch.topk(part, 2).values
            gap = min(gap, float(top[0] - top[1]))
        y, d = int(logits[:vocab].argmax()), durations[int(logits[vocab:].argmax())]
        decisions.append((float(logits[:vocab].float().log_softmax(-1)[y]), y != blank))
        if y == blank:
            t, sym = t + max(d, 1), 0
            continue
        tokens.append(y)
        frames.append(t)
        window = (window + [y])[-2:]
        dec = pred.decoder_out(torch.tensor([window]))
        sym += 1
        if d == 0 and sym >= max_sym:
            d = 1
        if d > 0:
            t, sym = t + d, 0
    return tokens, frames, gap, decisions


@pytest.mark.parametrize("max_symbols", [1, 2])
def test_tdt_greedy_equals_a_plain_nemo_style_loop_and_batched_equals_alone(max_symbols):
    durations, lengths = (0, 1, 2, 3), [40, 25, 33, 3]
    pred, joiner = toy(seed=8, durations=durations, blank_bias=-1.0)
    with torch.no_grad():
        joiner.out.weight.mul_(0.3)  # seed 8 at this scale: every decision leads by > 0.3
    hidden = frames_of(8, len(lengths), max(lengths))
    with torch.no_grad():
        enc = joiner.project_encoder(hidden)
        batched = transducer_greedy_search(pred, joiner, enc, lengths, blank_id=0, max_symbols=max_symbols)
        for b, n in enumerate(lengths):
            tokens, frames, gap, _ = oracle_tdt(pred, joiner, hidden[b, :n], durations, max_symbols)
            assert gap > 1e-6
            assert batched[b].tokens == tokens and batched[b].token_frames == frames
            alone = transducer_greedy_search(pred, joiner, enc[b:b + 1, :n], [n], blank_id=0, max_symbols=max_symbols)
            assert alone[0].tokens == tokens
    jumps = [f2 - f1 for h in batched for f1, f2 in itertools.pairwise(h.token_frames)]
    assert sum(len(h.tokens) for h in batched) >= 30 and max(jumps) >= 2  # durations skip frames
    repeats = sum(len(h.token_frames) - len(set(h.token_frames)) for h in batched)
    assert (repeats > 0) == (max_symbols > 1)  # duration 0 keeps the frame, up to max_symbols labels



def test_tdt_greedy_score_and_confidences_are_the_chosen_log_probs_blanks_included():
    # scores and confidences read back from the one host transfer per decision, against the plain loop
    durations, lengths = (0, 1, 2, 3), [40, 25, 33, 3]
    pred, joiner = toy(seed=8, durations=durations, blank_bias=-1.0)
    with torch.no_grad():
        joiner.out.weight.mul_(0.3)
    hidden = frames_of(8, len(lengths), max(lengths))
    with torch.no_grad():
        enc = joiner.project_encoder(hidden)
        batched = transducer_greedy_search(pred, joiner, enc, lengths, blank_id=0, max_symbols=2)
        blanks = 0
        for b, n in enumerate(lengths):
            tokens, _, gap, decisions = oracle_tdt(pred, joiner, hidden[b, :n], durations, 2)
            assert gap > 1e-6 and batched[b].tokens == tokens
            assert batched[b].score == pytest.approx(math.fsum(lp for lp, _ in decisions), abs=1e-6)
            assert batched[b].token_confidences == pytest.approx([math.exp(lp) for lp, e in decisions if e],
                                                                 rel=1e-6)
            blanks += sum(not e for _, e in decisions)
    assert blanks >= 10  # blank decisions count in the score

# -- streaming ------------------------------------------------------------------------------------------
SPLITS = [[1] * 13, [3, 3, 3, 3, 1], [5, 8], [2, 7, 1, 3]]


def _stream(strategy, model, feats, lengths, options, split):
    searches = [strategy.stream_search(o) for o in options]
    start = 0
    for size in split:
        hidden, _ = model.encode_offline(feats[:, start:start + size], None)
        counts = [max(0, min(size, n - start)) for n in lengths]
        strategy.advance_streams(searches, hidden, counts)
        start += size
    return [s.final([], strategy.frame_seconds()) for s in searches]


@pytest.mark.parametrize("case", ["greedy1", "greedy3", "lstm", "beam", "hotwords", "tdt", "tdt_beam", "tdt_maes"])
def test_streaming_in_chunks_equals_offline(case):
    if case in ("tdt_beam", "tdt_maes"):  # NeMo's TDT beam search over a recurrent predictor, blank 0
        model = ToyTransducerModel(ToyTransducerConfig(feat_dim=6, vocab=7, recurrent=True, durations=(0, 1, 2, 3)))
        with torch.no_grad():
            model.joiner.out.weight.mul_(0.5)
        feats = frames_of(7, 3, 13, dtype=torch.float32)
        lengths = [13, 8, 11]
    elif case == "tdt":
        model = ScriptedModel(durations=(0, 1, 2, 3))
        feats = torch.stack([scripted_rows(TDT_ROWS + TDT_ROWS[:4], 7, (0, 1, 2, 3))] * 2)
        lengths = [13, 9]
    else:
        model = ToyTransducerModel(ToyTransducerConfig(feat_dim=6, vocab=7, recurrent=case == "lstm")).double()
        with torch.no_grad():
            model.joiner.out.bias[0] += 1.0
        feats = frames_of(7, 3, 13)
        lengths = [13, 8, 11]
    options = TransducerOptions(max_symbols=3 if case in ("greedy3", "tdt") else 1,
                                search="maes" if case == "tdt_maes" else None)
    strategy = strategy_for(model, options)
    if case in ("beam", "tdt_beam", "tdt_maes"):
        opts = [DecodingOptions(beam_size=4, n_best=3)] * len(lengths)
    elif case == "hotwords":
        opts = [DecodingOptions(hotwords=("bd",))] * len(lengths)
    else:
        opts = [DecodingOptions()] * len(lengths)
    with torch.no_grad():
        offline = strategy.decode(DecodeBatch(["r"] * len(lengths), opts, [torch.zeros(1)] * len(lengths),
                                              feats=feats, feat_lens=torch.tensor(lengths)))
        for split in SPLITS:
            streamed = _stream(strategy, model, feats, lengths, opts, split)
            for a, b in zip(offline, streamed, strict=True):
                assert a.tokens == b.tokens and a.token_frames == b.token_frames
                assert a.score == pytest.approx(b.score, abs=1e-5)
                assert [h.tokens for h in a.nbest or []] == [h.tokens for h in b.nbest or []]
    assert sum(len(h.tokens) for h in offline) >= 6


# -- options and refusals -----------------------------------------------------------------------------
def test_checkpoint_defaults_stand_in_for_unset_engine_options():
    model = ToyTransducerModel(ToyTransducerConfig())
    defaults = DecodingDefaults(decode_type="transducer", blank_id=0,
                                options={"max_symbols": 3, "beam_size": 6, "unk_id": 2})
    strategy = strategy_for(model, defaults=defaults)
    assert (strategy.options.max_symbols, strategy.options.beam_size, strategy.options.search) == (3, 6, "greedy")
    assert strategy.unk_id == 2
    explicit = strategy_for(model, TransducerOptions(max_symbols=2), defaults=defaults)
    assert (explicit.options.max_symbols, explicit.options.beam_size) == (2, 6)
    plain = strategy_for(model)
    assert (plain.options.max_symbols, plain.options.beam_size, plain.options.hotword_score) == (1, 4, 1.5)
    parsed = TransducerDecodeStrategy.parse_options({"search": "modified_beam", "beam_size": 8})
    assert parsed.search == "modified_beam" and parsed.beam_size == 8
    with pytest.raises(ConfigError, match="max_symbols"):
        strategy_for(model, TransducerOptions(max_symbols=0))


def test_beam_is_refused_for_a_recurrent_predictor_at_construction_and_admission():
    model = ToyTransducerModel(ToyTransducerConfig(recurrent=True))
    with pytest.raises(ConfigError, match="search='modified_beam' is refused: .*label_window_state is False"):
        strategy_for(model, TransducerOptions(search="modified_beam"))
    with pytest.raises(ConfigError, match="beam_size=4 is refused: .*label_window_state is False") as err:
        strategy_for(model, TransducerOptions(beam_size=4))
    assert err.value.key == "beam_size"
    strategy_for(model, defaults=DecodingDefaults(decode_type="transducer", blank_id=0, options={"beam_size": 4}))
    strategy = strategy_for(model)
    strategy.validate(DecodingOptions(beam_size=1))
    with pytest.raises(RequestError, match="label-window state") as err:
        strategy.validate(DecodingOptions(beam_size=4), request_id="r1")
    assert err.value.param == "beam_size"
    with pytest.raises(RequestError, match="recurrent state") as err:
        strategy.validate(DecodingOptions(hotwords=("bd",)))
    assert err.value.param == "hotwords"
    with pytest.raises(RequestError, match="recurrent state") as err:
        strategy.validate(DecodingOptions(n_best=2, beam_size=None))
    assert err.value.param == "n_best"
    with pytest.raises(ConfigError, match="label-window predictor state"):
        BeamRows(model.predictor, model.joiner, 1, "cpu", blank_id=0)


def test_n_best_above_the_beam_and_bad_hotwords_and_tdt_hotwords_are_refused():
    strategy = strategy_for(ToyTransducerModel(ToyTransducerConfig()))
    strategy.validate(DecodingOptions(n_best=4))
    with pytest.raises(RequestError, match="n_best=5 exceeds the beam size 4") as err:
        strategy.validate(DecodingOptions(n_best=5))
    assert err.value.param == "n_best"
    strategy.validate(DecodingOptions(beam_size=8, n_best=5))
    with pytest.raises(RequestError, match="hotwords cannot be tokenized"):
        strategy.validate(DecodingOptions(hotwords=("xyz",)))
    with pytest.raises(RequestError, match="cannot honour"):
        strategy.validate(DecodingOptions(language="en"))
    tdt = strategy_for(ScriptedModel(durations=(0, 1, 2)))
    tdt.validate(DecodingOptions(beam_size=4, n_best=2))  # TDT beam search: any predictor
    with pytest.raises(RequestError, match="hotwords .* not supported by TDT beam search") as err:
        tdt.validate(DecodingOptions(hotwords=("bd",)))
    assert err.value.param == "hotwords"
    with pytest.raises(ConfigError, match="TDT durations"):  # the modified beam search itself still refuses them
        BeamRows(*toy(durations=(0, 1, 2)), 1, "cpu", blank_id=0)
    with pytest.raises(ConfigError, match="search='maes' is refused: mAES is NeMo's search over a TDT joint"):
        strategy_for(ToyTransducerModel(ToyTransducerConfig()), TransducerOptions(search="maes"))
    with pytest.raises(ConfigError, match="'greedy', 'modified_beam' or 'maes'"):
        strategy_for(ToyTransducerModel(ToyTransducerConfig()), TransducerOptions(search="tsd"))
    with pytest.raises(ConfigError, match="n_best"):
        pred, joiner = toy()
        transducer_modified_beam_search(pred, joiner, torch.zeros(1, 2, 16, dtype=F64), [2], blank_id=0,
                                        beam_size=2, n_best=3)
    with pytest.raises(ConfigError, match="max_symbols"):
        GreedyRows(*toy(), 1, "cpu", blank_id=0, max_symbols=0)


def test_a_model_without_predictor_or_joiner_is_refused_naming_them():
    from oasr.errors import CapabilityError

    model = ToyTransducerModel(ToyTransducerConfig())
    del model.predictor
    with pytest.raises(CapabilityError, match="predictor"):
        strategy_for(model)
