"""Per-request searches over a speech LLM's next-token logits: greedy and transformers' beam search.

Each search owns the rows of one request in the shared decode batch.  ``advance(logits)`` takes the
logits (rows, V) of its rows and returns ``(parents, tokens)`` — which of its rows each next row
continues and the token it is fed — or ``None`` when the request is finished; ``result()`` gives the
tokens (stop token excluded) and the score.

:class:`GreedySearch` is ``generate(do_sample=False, num_beams=1)``: the float32 argmax, until a stop
token or ``max_new_tokens`` tokens (the stop token counted).

:class:`BeamSearch` is transformers' (5.x, vectorized) beam search step for step: float32 log-softmax
plus the running beam scores, the top ``max(2, 1 + n_stop) * k`` continuations, the best ``k`` that hit
no stop criterion continue, those among the top ``k`` that hit one (a stop token, or the length
ceiling) enter the finished set normalized by ``generated_length ** length_penalty``; the search ends
when the best running beam cannot beat the worst finished one (``early_stopping=False``'s heuristic),
every continuation hits a stop criterion, or (``early_stopping=True``) ``k`` beams finished.
"""

from __future__ import annotations

import torch

NEG = -1.0e9


class GreedySearch:
    def __init__(self, stop_ids: tuple[int, ...], max_new_tokens: int):
        self.stop = set(stop_ids)
        self.max_new = max_new_tokens
        self.tokens: list[int] = []
        self.stopped = False
        self.logprob = 0.0

    #: rows this search occupies in the decode batch
    k = 1

    def advance(self, logits: torch.Tensor) -> tuple[list[int], list[int]] | None:
        scores = logits.float()
        token = int(scores[0].argmax())
        self.logprob += float(torch.log_softmax(scores[0], dim=-1)[token])
        if token in self.stop:
            self.stopped = True
            return None
        self.tokens.append(token)
        if len(self.tokens) >= self.max_new:
            return None
        return [0], [token]

    def result(self) -> tuple[list[int], float]:
        return list(self.tokens), self.logprob


class BeamSearch:
    def __init__(self, stop_ids: tuple[int, ...], max_new_tokens: int, beam_size: int, *,
                 length_penalty: float = 1.0, early_stopping: bool = False):
        self.stop = torch.tensor(sorted(set(stop_ids)), dtype=torch.long)
        self.k = beam_size
        self.keep = max(2, 1 + len(set(stop_ids))) * beam_size
        self.max_new = max_new_tokens
        self.length_penalty = length_penalty
        self.early_stopping = early_stopping
        self.running_scores = torch.full((beam_size,), NEG, dtype=torch.float32)
        self.running_scores[0] = 0.0
        self.running: list[list[int]] = [[] for _ in range(beam_size)]
        self.finished_scores = torch.full((beam_size,), NEG, dtype=torch.float32)
        self.finished: list[list[int]] = [[] for _ in range(beam_size)]
        self.finished_flags = torch.zeros(beam_size, dtype=torch.bool)
        self.improvable = True
        self.generated = 0
        self.top_mask = torch.arange(self.keep) < beam_size

    def advance(self, logits: torch.Tensor) -> tuple[list[int], list[int]] | None:
        k = self.k
        if logits.shape[0] == 1 and k > 1:  # a just-prefilled request: its k beams start identical
            logits = logits.expand(k, logits.shape[1])
        vocab = logits.shape[1]
        log_probs = torch.log_softmax(logits.float(), dim=-1) + self.running_scores[:, None]
        top_scores, top_index = torch.topk(log_probs.reshape(-1), k=self.keep)
        parents, ids = top_index // vocab, top_index % vocab
        candidates = [self.running[int(p)] + [int(t)] for p, t in zip(parents, ids, strict=True)]
        length = self.generated + 1
        hits = torch.isin(ids, self.stop) | (length >= self.max_new)

        continuing = top_scores + hits.to(torch.float32) * NEG
        chosen = torch.topk(continuing, k=k)[1]
        self.running_scores = continuing[chosen]
        self.running = [candidates[int(i)] for i in chosen]
        next_parents = [int(parents[int(i)]) for i in chosen]

        normalized = top_scores / (length ** self.length_penalty)
        if self.early_stopping and bool(self.finished_flags.all()):
            normalized = normalized + NEG
        if not self.improvable:
            normalized = normalized + NEG
        just_finished = hits & self.top_mask
        normalized = normalized + (~just_finished) * NEG
        merged = torch.cat((self.finished_scores, normalized))
        best = torch.topk(merged, k=k)[1]
        pool = self.finished + candidates
        flags = torch.cat((self.finished_flags, just_finished))
        self.finished = [pool[int(i)] for i in best]
        self.finished_scores = merged[best]
        self.finished_flags = flags[best]

        self.generated = length
        best_running = self.running_scores[0] / (self.generated ** self.length_penalty)
        worst = torch.where(self.finished_flags, self.finished_scores.min(), torch.tensor(NEG))
        self.improvable = self.improvable and bool((best_running > worst).any())
        open_beam = not (bool(self.finished_flags.all()) and self.early_stopping)
        if not (self.improvable and open_beam and not bool(hits.all())):
            return None
        return next_parents, [seq[-1] for seq in self.running]

    def result(self) -> tuple[list[int], float]:
        return self.results(1)[0]

    def results(self, n: int) -> list[tuple[list[int], float]]:
        """The ``n`` best finished hypotheses, best first (``num_return_sequences``), stop token removed."""
        stops = set(self.stop.tolist())
        out = []
        for seq, score in zip(self.finished[:n], self.finished_scores[:n].tolist(), strict=True):
            tokens = list(seq)
            if tokens and int(tokens[-1]) in stops:
                tokens = tokens[:-1]
            out.append((tokens, float(score)))
        return out
