"""Batched search over 30 s Whisper windows: greedy, sampling and beam search with openai-whisper's rules.

One call decodes any number of windows, each with its own prompt (previous text, language, task,
timestamps or not), temperature and beam size.  Windows that share a beam size share one batch:
rows of different prompt lengths are prefilled together and stepped together, a finished row (or a
finished beam group) leaves the batch through :meth:`WhisperDecoder.select`.

The rules are openai-whisper's ``decoding.py`` (which faster-whisper/CTranslate2 and transformers
follow): suppress the configured non-speech and control tokens, suppress blank and end-of-text as
the first token, the timestamp-pair rules with the initial-timestamp limit and "a timestamp wins
when all timestamps together outweigh the best text token"; greedy or sampling at a temperature; the
beam search keeps ``beam_size`` live beams per window from each beam's ``beam_size + 1`` best
continuations, collects ``beam_size x patience`` finished candidates, and ranks them by log
probability over length (or the Google NMT length penalty).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs
import torch
import torch.nn.functional as F

from oasr_models_hf.whisper.config import WhisperGeneration
from oasr_models_hf.whisper.model import WhisperDecoder, WhisperDecoderState
from oasr_models_hf.whisper.screen import Screened, VocabScreen

NEG_INF = float("-inf")


@attrs.define
class WindowTask:
    """What to decode in one window.

    ``prompt``: the initial tokens (``[<|startofprev|>, previous text...]`` then the SOT sequence,
    ending with ``<|notimestamps|>`` when ``timestamps`` is False); ``sot_index``: where
    ``<|startoftranscript|>`` sits in it (its logits give the no-speech probability).
    """

    prompt: list[int]
    sot_index: int
    timestamps: bool
    temperature: float = 0.0
    beam_size: int | None = None
    patience: float = 1.0
    length_penalty: float | None = None
    max_new_tokens: int = 224
    #: "openai" (openai-whisper and CTranslate2) or "transformers" (GenerationMixin's beam search)
    beam_style: str = "openai"
    #: token ids suppressed at every step besides the control tokens (None: the checkpoint's set)
    suppress: tuple[int, ...] | None = None
    #: the random generator sampling draws from (None: the one passed to :func:`search_windows`)
    generator: torch.Generator | None = attrs.field(default=None, eq=False)


@attrs.define
class Candidate:
    tokens: list[int]
    sum_logprob: float
    score: float


@attrs.define
class WindowResult:
    """The decoded tokens of a window (end-of-text excluded, timestamp tokens kept) and their scores;
    ``candidates`` ranked best first (beam search: every finished beam; otherwise the one result)."""

    tokens: list[int]
    sum_logprob: float
    avg_logprob: float
    no_speech_prob: float
    temperature: float
    candidates: list[Candidate]


class LogitRules:
    """openai-whisper's logit filters, applied in place to a batch of next-token logits."""

    def __init__(self, gen: WhisperGeneration, vocab_size: int, device: torch.device):
        specials = (gen.transcribe_id, gen.translate_id, gen.sot_id, gen.sot_prev_id, gen.sot_lm_id, gen.no_speech_id)
        self.specials = {s for s in specials if s is not None}
        self.vocab_size = vocab_size
        self.device = device
        self.suppress = self._ids(gen.suppress_tokens)
        self._custom: dict[tuple[int, ...], torch.Tensor] = {}
        self.begin_suppress = torch.tensor(list(gen.begin_suppress_tokens), dtype=torch.long, device=device)
        self.eot = gen.eot_id
        self.no_timestamps = gen.no_timestamps_id
        self.ts_begin = gen.timestamp_begin
        self.max_initial = gen.max_initial_timestamp_index

    def _ids(self, tokens) -> torch.Tensor:
        ids = sorted({*tokens, *self.specials})
        return torch.tensor([t for t in ids if 0 <= t < self.vocab_size], dtype=torch.long, device=self.device)

    def apply(self, logits: torch.Tensor, generated: Sequence[list[int]], timestamps: Sequence[bool],
              suppress: Sequence[tuple[int, ...] | None] | None = None, *, outweigh: bool = True) -> None:
        """Filter ``logits`` (rows, V) in place; ``suppress`` per row: its own suppressed ids (None: the
        checkpoint's).  ``outweigh=False`` applies only the masks (every rule but the value-dependent
        "timestamps outweigh text"; :meth:`outweigh` applies that one)."""
        first = [j for j, seq in enumerate(generated) if not seq]
        if first:
            rows = torch.tensor(first, device=logits.device)
            logits[rows[:, None], self.begin_suppress[None, :]] = NEG_INF
        if suppress is None or all(s is None for s in suppress):
            if self.suppress.numel():
                logits[:, self.suppress] = NEG_INF
        else:
            groups: dict[tuple[int, ...] | None, list[int]] = {}
            for j, own in enumerate(suppress):
                groups.setdefault(own, []).append(j)
            for own, members in groups.items():
                ids = self.suppress if own is None else self._custom.setdefault(own, self._ids(own))
                if ids.numel():
                    logits[torch.tensor(members, device=logits.device)[:, None], ids[None, :]] = NEG_INF
        ts_rows = [j for j, flag in enumerate(timestamps) if flag]
        if ts_rows:
            self._timestamp_rules(logits, ts_rows, generated)
            if outweigh:
                self.outweigh(logits, ts_rows)

    def _timestamp_rules(self, logits: torch.Tensor, rows: list[int], generated: Sequence[list[int]]) -> None:
        """openai-whisper's ``ApplyTimestampRules`` on ``rows`` of ``logits``, in place, but the last
        rule (:meth:`outweigh`).  Each rule fills a slice of a row (no vocabulary-wide masks)."""
        ts_begin, eot = self.ts_begin, self.eot
        logits[rows, self.no_timestamps] = NEG_INF
        for j in rows:
            seq, row = generated[j], logits[j]
            if not seq:  # the first token is a timestamp, at most max_initial steps in
                row[:ts_begin] = NEG_INF
                if self.max_initial is not None:
                    row[ts_begin + self.max_initial + 1:] = NEG_INF
                continue
            last = seq[-1] >= ts_begin
            penultimate = len(seq) < 2 or seq[-2] >= ts_begin
            if last and penultimate:  # two timestamps in a row: text must follow
                row[ts_begin:] = NEG_INF
            elif last:  # an open segment: close it (or end)
                row[:eot] = NEG_INF
            stamp = next((t for t in reversed(seq) if t >= ts_begin), None)
            if stamp is not None:  # timestamps never decrease, and a segment has non-zero length
                row[ts_begin:stamp if last and not penultimate else stamp + 1] = NEG_INF

    def outweigh(self, logits: torch.Tensor, rows: list[int]) -> None:
        """The last timestamp rule on ``rows``: text is masked where the log-sum-exp of the timestamp
        logits exceeds the best text logit (their log-probabilities compared: the normalizer cancels)."""
        ts_begin = self.ts_begin
        index = torch.tensor(rows, device=logits.device)
        sub = logits.index_select(0, index).float()
        # amax: the value alone, ~7x faster than max(dim) over 50k logits (which also finds the index)
        ts_wins = sub[:, ts_begin:].logsumexp(dim=-1) > sub[:, :ts_begin].amax(dim=-1)
        for j, wins in zip(rows, ts_wins.tolist(), strict=True):
            if wins:
                logits[j, :ts_begin] = NEG_INF


def _pad_prompts(prompts: list[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    longest = max(len(p) for p in prompts)
    tokens = torch.zeros(len(prompts), longest, dtype=torch.long)
    for i, p in enumerate(prompts):
        tokens[i, : len(p)] = torch.tensor(p, dtype=torch.long)
    lengths = torch.tensor([len(p) for p in prompts], dtype=torch.long)
    return tokens.to(device), lengths.to(device)


def _prefill(decoder: WhisperDecoder, cross, tasks: list[WindowTask], no_speech_id: int | None, device: torch.device,
             ) -> tuple[WhisperDecoderState, torch.Tensor, list[float]]:
    tokens, lengths = _pad_prompts([t.prompt for t in tasks], device)
    capacity = int(lengths.max()) + max(t.max_new_tokens for t in tasks) + 1
    state, hidden = decoder.prefill(cross, tokens, lengths, capacity=capacity)
    rows = torch.arange(len(tasks), device=device)
    logits = decoder.logits(hidden[rows, lengths - 1]).float()
    if no_speech_id is None:
        return state, logits, [math.nan] * len(tasks)
    sot = torch.tensor([t.sot_index for t in tasks], device=device)
    probs = decoder.logits(hidden[rows, sot]).float().softmax(dim=-1)[:, no_speech_id]
    return state, logits, probs.tolist()


def _length_limit(task: WindowTask, n_ctx: int) -> int:
    """New tokens a row may add: its own limit, and the decoder's positions (openai stops once the
    whole sequence exceeds n_ctx)."""
    return min(task.max_new_tokens, n_ctx + 1 - len(task.prompt))


def _project(decoder: WhisperDecoder, screen: VocabScreen | None, state: WhisperDecoderState, feed: torch.Tensor
             ) -> tuple[torch.Tensor, Screened | None]:
    """One decoder step: fp32 logits, or (with a screen) its approximate logits and their bounds."""
    if screen is None:
        return decoder.step(state, feed).float(), None
    screened = screen.project(decoder.step_hidden(state, feed))
    return screened.logits, screened


def _filter(decoder: WhisperDecoder, screen: VocabScreen | None, rules: LogitRules, logits: torch.Tensor,
            screened: Screened | None, k: int, generated: Sequence[list[int]], timestamps: Sequence[bool],
            suppress: Sequence[tuple[int, ...] | None]) -> tuple[torch.Tensor, bool]:
    """The rules applied to a step's ``logits``, and whether the result is screened.  Screened logits
    (``screened.logits is logits``): the masks first, then the screen makes exact every logit the row's
    ``k`` best and the timestamp rule can depend on, then that rule; the full fp32 product (not
    screened) when too many would need recomputing."""
    if screen is not None and screened is not None:
        rules.apply(logits, generated, timestamps, suppress, outweigh=False)
        if screen.resolve(screened, k, torch.tensor(list(timestamps), dtype=torch.bool, device=logits.device)):
            ts_rows = [j for j, flag in enumerate(timestamps) if flag]
            if ts_rows:
                rules.outweigh(logits, ts_rows)
            return logits, True
        logits = decoder.logits(screened.hidden).float()
    rules.apply(logits, generated, timestamps, suppress)
    return logits, False


class _DeferredLogprobs:
    """The exact log-probabilities of screened greedy steps, computed in batches after the steps.

    A screened row's chosen logit is exact but its log-softmax normalizer is not (most logits are
    int8 approximations).  Greedy decisions never read a log-probability, so each screened step
    keeps its final hidden state, the rules' mask of its row (the -inf entries of the filtered
    logits) and its token; :meth:`flush` projects up to :data:`FLUSH_ROWS` of them through the fp32
    table at once (one read of the table for many steps) and adds the chosen token's log-softmax
    over the unmasked logits to ``sums``: the log-probability the full product gives.
    """

    FLUSH_ROWS = 256

    def __init__(self, decoder: WhisperDecoder, sums: list[float]):
        self.decoder, self.sums = decoder, sums
        self.owners: list[int] = []
        self.hidden: list[torch.Tensor] = []
        self.masks: list[torch.Tensor] = []
        self.tokens: list[torch.Tensor] = []

    def add(self, owners: list[int], hidden: torch.Tensor, filtered: torch.Tensor, tokens: torch.Tensor) -> None:
        self.owners.extend(owners)
        self.hidden.append(hidden)
        self.masks.append(torch.isinf(filtered))
        self.tokens.append(tokens)
        if len(self.owners) >= self.FLUSH_ROWS:
            self.flush()

    def flush(self) -> None:
        if not self.owners:
            return
        logits = self.decoder.logits(torch.cat(self.hidden)).float()
        logits.masked_fill_(torch.cat(self.masks), NEG_INF)
        # the full product's own log_softmax (as openai-whisper's): its fp32 sums, not a closer one
        logprobs = F.log_softmax(logits, dim=-1).gather(1, torch.cat(self.tokens)[:, None])[:, 0]
        for i, lp in zip(self.owners, logprobs.tolist(), strict=True):
            self.sums[i] += lp
        self.owners, self.hidden, self.masks, self.tokens = [], [], [], []


def _select(logits: torch.Tensor, temperatures: list[float], generators: list[torch.Generator | None]
            ) -> torch.Tensor:
    """Greedy rows take the argmax; rows at a temperature draw from their own generator (rows sharing
    one draw together, in row order)."""
    chosen = logits.argmax(dim=-1)
    groups: dict[int, list[int]] = {}
    for j, t in enumerate(temperatures):
        if t > 0:
            groups.setdefault(id(generators[j]), []).append(j)
    for sampled in groups.values():
        rows = torch.tensor(sampled, device=logits.device)
        temps = torch.tensor([temperatures[j] for j in sampled], device=logits.device)[:, None]
        probs = (logits[rows] / temps).softmax(dim=-1)
        # with replacement: the draw torch.distributions.Categorical (openai-whisper) makes
        chosen[rows] = torch.multinomial(probs, 1, replacement=True, generator=generators[sampled[0]])[:, 0]
    return chosen


def _greedy(decoder: WhisperDecoder, cross, tasks: list[WindowTask], rules: LogitRules, gen: WhisperGeneration,
            device: torch.device, generator: torch.Generator | None) -> list[WindowResult]:
    state, logits, no_speech = _prefill(decoder, cross, tasks, gen.no_speech_id, device)
    n_ctx = decoder.max_positions
    # sampled rows take the full product (their softmax needs every logit)
    screen = decoder.vocab_screen(gen.eot_id) if all(t.temperature == 0 for t in tasks) else None
    screened: Screened | None = None
    generated: list[list[int]] = [[] for _ in tasks]
    sum_lp = [0.0] * len(tasks)
    deferred = _DeferredLogprobs(decoder, sum_lp)
    # ``rows``: the task of each batch row.  A finished row rides along (fed end-of-text) until a
    # quarter of the batch has finished: dropping rows copies every other row's K/V, so it is batched.
    rows = [i for i, t in enumerate(tasks) if _length_limit(t, n_ctx) > 0]
    if len(rows) < len(tasks):
        state, logits = decoder.select(state, rows), logits[rows]
    live = list(range(len(rows)))  # batch positions still generating
    while live:
        if len(live) < len(rows) and screened is not None:
            screened = screened.take(live)
        sub = screened.logits if screened is not None else logits if len(live) == len(rows) else logits[live]
        sub, exact_later = _filter(decoder, screen, rules, sub, screened, 1, [generated[rows[j]] for j in live],
                                   [tasks[rows[j]].timestamps for j in live], [tasks[rows[j]].suppress for j in live])
        chosen = _select(sub, [tasks[rows[j]].temperature for j in live],
                         [tasks[rows[j]].generator or generator for j in live])
        if exact_later:  # the screened normalizer is approximate: the exact one after the steps
            deferred.add([rows[j] for j in live], screened.hidden, sub, chosen)
            logprobs = [0.0] * len(live)
        else:
            logprobs = F.log_softmax(sub, dim=-1).gather(1, chosen[:, None])[:, 0].tolist()
        still, full = [], False
        for j, token, lp in zip(live, chosen.tolist(), logprobs, strict=False):
            i = rows[j]
            generated[i].append(token)
            sum_lp[i] += lp
            if token != gen.eot_id and len(generated[i]) < _length_limit(tasks[i], n_ctx):
                still.append(j)
            elif len(tasks[i].prompt) + len(generated[i]) >= n_ctx:
                full = True  # this row has no position left to ride along in
        if not still:
            break
        if len(live) == len(rows):
            feed = chosen
        else:
            feed = torch.full((len(rows),), gen.eot_id, dtype=torch.long, device=device)
            feed[live] = chosen
        if full or len(rows) - len(still) >= max(1, len(rows) // 4):
            state, feed = decoder.select(state, still), feed[still]
            rows = [rows[j] for j in still]
            still = list(range(len(rows)))
        live = still
        logits, screened = _project(decoder, screen, state, feed)
    deferred.flush()
    if screen is None:
        decoder.count_plain_steps(sum(len(g) for g in generated))
    results = []
    for i, task in enumerate(tasks):
        tokens = generated[i][:-1] if generated[i] and generated[i][-1] == gen.eot_id else generated[i]
        avg = sum_lp[i] / (len(tokens) + 1)
        results.append(WindowResult(tokens, sum_lp[i], avg, no_speech[i], task.temperature,
                                    [Candidate(tokens, sum_lp[i], avg)]))
    return results


def _rank(candidates: dict[tuple[int, ...], float], eot: int, length_penalty: float | None) -> list[Candidate]:
    out = []
    for seq, logprob in candidates.items():
        tokens = list(seq[:-1]) if seq and seq[-1] == eot else list(seq)
        length = len(tokens)
        penalty = length if length_penalty is None else ((5 + length) / 6) ** length_penalty
        out.append(Candidate(tokens, logprob, logprob / penalty if penalty else NEG_INF))
    # stable: the earlier-finished candidate wins a tie, as argmax over insertion order does
    return sorted(out, key=lambda c: c.score, reverse=True)


def _beam(decoder: WhisperDecoder, cross, tasks: list[WindowTask], rules: LogitRules, gen: WhisperGeneration,
          device: torch.device, beam: int) -> list[WindowResult]:
    eot, n_ctx = gen.eot_id, decoder.max_positions
    state, logits, no_speech = _prefill(decoder, cross, tasks, gen.no_speech_id, device)
    expand = [i for i in range(len(tasks)) for _ in range(beam)]
    state, logits = decoder.select(state, expand), logits[expand]
    # row r of the batch is beam (r % beam) of window alive[r // beam]
    alive = [i for i, t in enumerate(tasks) if _length_limit(t, n_ctx) > 0]
    if len(alive) < len(tasks):
        keep = [r for r, i in enumerate(expand) if i in set(alive)]
        state, logits = decoder.select(state, keep), logits[keep]
    beams: list[list[tuple[int, ...]]] = [[()] * beam for _ in tasks]
    sums: list[list[float]] = [[0.0] * beam for _ in tasks]
    finished: list[dict[tuple[int, ...], float]] = [{} for _ in tasks]
    max_candidates = [max(1, round(beam * t.patience)) for t in tasks]
    # beam scores rank hypotheses at every step: screened only with the approximate normalizer allowed
    screen = decoder.vocab_screen(eot) if decoder.screen_beam_vocabulary else None
    screened = None
    while alive:
        generated = [list(beams[i][b]) for i in alive for b in range(beam)]
        logits, _ = _filter(decoder, screen, rules, logits, screened, beam + 1, generated,
                         [tasks[i].timestamps for i in alive for _ in range(beam)],
                         [tasks[i].suppress for i in alive for _ in range(beam)])
        top_lp, top_ids = F.log_softmax(logits, dim=-1).topk(beam + 1, dim=-1)
        top_lp, top_ids = top_lp.tolist(), top_ids.tolist()
        sources, next_tokens, still = [], [], []
        for a, i in enumerate(alive):
            scores: dict[tuple[int, ...], float] = {}
            origin: dict[tuple[int, ...], int] = {}
            for b in range(beam):
                row = a * beam + b
                for lp, token in zip(top_lp[row], top_ids[row], strict=False):
                    seq = beams[i][b] + (token,)
                    scores[seq] = sums[i][b] + lp
                    origin[seq] = row
            kept: list[tuple[int, ...]] = []
            newly: dict[tuple[int, ...], float] = {}
            for seq in sorted(scores, key=scores.get, reverse=True):
                if seq[-1] == eot:
                    newly[seq] = scores[seq]
                else:
                    kept.append(seq)
                    if len(kept) == beam:
                        break
            for seq in sorted(newly, key=newly.get, reverse=True):
                if len(finished[i]) >= max_candidates[i]:
                    break
                finished[i][seq] = newly[seq]
            beams[i], sums[i] = kept, [scores[s] for s in kept]
            out_of_room = len(kept[0]) >= _length_limit(tasks[i], n_ctx)
            if len(finished[i]) >= max_candidates[i] or out_of_room:
                continue
            still.append(i)
            sources.extend(origin[s] for s in kept)
            next_tokens.extend(s[-1] for s in kept)
        alive = still
        if not alive:
            break
        state = decoder.select(state, sources)
        logits, screened = _project(decoder, screen, state, torch.tensor(next_tokens, device=device))
    results = []
    for i, task in enumerate(tasks):
        pool = finished[i]
        if len(pool) < beam:  # not enough finished beams: the live ones count, best first
            for b in sorted(range(len(beams[i])), key=lambda b: sums[i][b], reverse=True):
                pool[beams[i][b] + (eot,)] = sums[i][b]
                if len(pool) >= beam:
                    break
        ranked = _rank(pool, eot, task.length_penalty)
        best = ranked[0]
        avg = best.sum_logprob / (len(best.tokens) + 1)
        results.append(WindowResult(best.tokens, best.sum_logprob, avg, no_speech[i], task.temperature, ranked))
    return results


def _beam_transformers(decoder: WhisperDecoder, cross, tasks: list[WindowTask], rules: LogitRules,
                       gen: WhisperGeneration, device: torch.device, beam: int) -> list[WindowResult]:
    """transformers' beam search (its defaults: length penalty 1, ``early_stopping=False``).

    Unlike openai-whisper's, beams are scored on log-probabilities taken before the suppress masks,
    the 2 x beam best continuations are drawn from all beams at once, only those among the best
    ``beam`` may finish, a finished beam scores log-probability / generated length (end-of-text
    included), and a window stops once no live beam can beat its worst finished one.
    """
    eot, n_ctx = gen.eot_id, decoder.max_positions
    state, logits, no_speech = _prefill(decoder, cross, tasks, gen.no_speech_id, device)
    vocab = logits.shape[-1]
    beams: list[list[tuple[int, ...]]] = [[()] * beam for _ in tasks]
    scores: list[list[float]] = [[0.0] + [-1e9] * (beam - 1) for _ in tasks]  # only beam 0 starts
    finished: list[list[tuple[float, tuple[int, ...]]]] = [[] for _ in tasks]
    alive = [i for i, t in enumerate(tasks) if _length_limit(t, n_ctx) > 0]
    expand = [i for i in alive for _ in range(beam)]
    state, logits = decoder.select(state, expand), logits[expand]
    step = 0
    while alive:
        step += 1
        logprobs = F.log_softmax(logits, dim=-1)
        rules.apply(logprobs, [list(beams[i][b]) for i in alive for b in range(beam)],
                    [tasks[i].timestamps for i in alive for _ in range(beam)],
                    [tasks[i].suppress for i in alive for _ in range(beam)])
        running = torch.tensor([scores[i] for i in alive], device=logprobs.device)
        total = (logprobs.view(len(alive), beam, vocab) + running[:, :, None]).view(len(alive), -1)
        top_lp, top_idx = total.topk(2 * beam, dim=-1)
        top_lp, top_idx = top_lp.tolist(), top_idx.tolist()
        still, sources, next_tokens = [], [], []
        for a, i in enumerate(alive):
            done_by_length = step >= _length_limit(tasks[i], n_ctx)
            cands = []
            for rank, (lp, flat) in enumerate(zip(top_lp[a], top_idx[a], strict=False)):
                b, token = divmod(flat, vocab)
                cands.append((lp, beams[i][b] + (token,), a * beam + b, token == eot or done_by_length, rank))
            # the live beams: the best continuations that did not stop
            live = sorted(cands, key=lambda c: c[0] - (1e9 if c[3] else 0.0), reverse=True)[:beam]
            beams[i] = [c[1] for c in live]
            scores[i] = [c[0] - (1e9 if c[3] else 0.0) for c in live]
            # the finished beams: among the best ``beam`` continuations, those that stopped
            new = [(c[0] / step, c[1]) for c in cands if c[3] and c[4] < beam]
            finished[i] = sorted(finished[i] + new, key=lambda f: f[0], reverse=True)[:beam]
            best_possible = scores[i][0] / step
            improvable = len(finished[i]) < beam or best_possible > finished[i][-1][0]
            if not improvable or all(c[3] for c in cands):
                continue
            still.append(i)
            sources.extend(c[2] for c in live)
            next_tokens.extend(c[1][-1] for c in live)
        alive = still
        if not alive:
            break
        state = decoder.select(state, sources)
        logits = decoder.step(state, torch.tensor(next_tokens, device=device)).float()
    results = []
    for i, task in enumerate(tasks):
        pool = finished[i] or [(scores[i][0], beams[i][0])]
        ranked = [Candidate(list(seq[:-1]) if seq and seq[-1] == eot else list(seq), score * max(1, len(seq)), score)
                  for score, seq in pool]
        best = ranked[0]
        avg = best.sum_logprob / (len(best.tokens) + 1)
        results.append(WindowResult(best.tokens, best.sum_logprob, avg, no_speech[i], task.temperature, ranked))
    return results


def search_windows(decoder: WhisperDecoder, cross_k: list[torch.Tensor], cross_v: list[torch.Tensor],
                   tasks: list[WindowTask], gen: WhisperGeneration, *,
                   generator: torch.Generator | None = None) -> list[WindowResult]:
    """Decode window ``i`` of the cross-attention K/V (per layer (N, H, S, Dh)) with ``tasks[i]``."""
    if len(tasks) != cross_k[0].shape[0]:
        raise ValueError(f"{len(tasks)} tasks for {cross_k[0].shape[0]} encoded windows")
    device = cross_k[0].device
    rules = LogitRules(gen, decoder.embed_tokens.num_embeddings, device)
    groups: dict[tuple[int, str], list[int]] = {}
    for i, task in enumerate(tasks):
        width = task.beam_size if (task.beam_size and task.temperature == 0) else 1
        groups.setdefault((width, task.beam_style if width > 1 else ""), []).append(i)
    results: list[WindowResult | None] = [None] * len(tasks)
    with decoder.pinned_weights():  # the weights hold still while the search runs
        for (width, style), members in groups.items():
            if len(members) == len(tasks):
                cross = (cross_k, cross_v)
            else:
                index = torch.tensor(members, device=device)
                cross = ([k.index_select(0, index) for k in cross_k], [v.index_select(0, index) for v in cross_v])
            subset = [tasks[i] for i in members]
            if width == 1:
                out = _greedy(decoder, cross, subset, rules, gen, device, generator)
            elif style == "transformers":
                out = _beam_transformers(decoder, cross, subset, rules, gen, device, width)
            else:
                out = _beam(decoder, cross, subset, rules, gen, device, width)
            for i, result in zip(members, out, strict=False):
                results[i] = result
    return results  # type: ignore[return-value]
