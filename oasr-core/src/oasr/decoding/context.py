"""Context biasing: a hotword graph that gives matching hypotheses a bonus during beam search.

The graph is an Aho–Corasick automaton over token sequences (the phrases), as WeNet's
``ContextGraph`` and sherpa-onnx's hotwords are.  Scoring, per hypothesis:

- a token that continues a match (the longest suffix of the hypothesis that is a prefix of some
  phrase) earns the phrase's per-token bonus;
- a token that breaks a match takes back the bonus the abandoned part had earned (the state falls
  back along failure arcs to the longest suffix that still matches);
- completing a phrase (or reaching a state whose suffix completes one) adds, once more, the bonus
  accumulated along every phrase completed there — this part is kept for good;
- at the end of decoding :meth:`ContextGraph.finalize` takes back the bonus of a match left partial.

So a hypothesis that contains a phrase of n tokens ends with n × bonus more than without it, and one
that only started a phrase ends with nothing extra; during the search partial matches are boosted so
that they survive pruning.

The graph is also stored as flat arrays (:meth:`ContextGraph.arrays`) for accelerated kernels; the
reference search uses :meth:`ContextGraph.step`.  Both compute a step's score as
``node_score[next] - node_score[state] + output_score[next]`` in float64.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

from oasr.errors import ConfigError

ROOT = 0


class ContextGraph:
    """Hotword phrases as an Aho–Corasick graph.  State 0 is the root (nothing matched).

    ``phrases``: token-id sequences; ``score``: bonus per matched token; ``phrase_scores``: an
    optional per-phrase bonus instead (a shared prefix keeps the bonus of the first phrase that
    created it).
    """

    def __init__(self, phrases: Sequence[Sequence[int]], score: float = 1.5,
                 phrase_scores: Sequence[float] | None = None):
        if phrase_scores is not None and len(phrase_scores) != len(phrases):
            raise ConfigError(f"phrase_scores has {len(phrase_scores)} entries for {len(phrases)} phrases",
                              key="phrase_scores")
        self._next: list[dict[int, int]] = [{}]
        node_score = [0.0]
        is_end = [False]
        for n, phrase in enumerate(phrases):
            tokens = [int(t) for t in phrase]
            if not tokens:
                raise ConfigError(f"hotword phrase {n} has no tokens", key="hotwords")
            bonus = float(score if phrase_scores is None else phrase_scores[n])
            node = ROOT
            for token in tokens:
                child = self._next[node].get(token)
                if child is None:
                    child = len(self._next)
                    self._next[node][token] = child
                    self._next.append({})
                    node_score.append(node_score[node] + bonus)
                    is_end.append(False)
                node = child
            is_end[node] = True
        self.num_phrases = len(phrases)
        count = len(self._next)
        fail = [ROOT] * count
        output = [0.0] * count
        # breadth-first: a node's failure target is shallower, so it is finished first (the root's
        # children fail to the root)
        queue = deque(self._next[ROOT].values())
        while queue:
            node = queue.popleft()
            output[node] = (node_score[node] if is_end[node] else 0.0) + output[fail[node]]
            for token, child in self._next[node].items():
                fail[child] = self._goto(fail[node], token, fail)
                queue.append(child)
        self.fail = fail
        self.node_score = node_score
        self.output_score = output
        self.is_end = is_end

    def _goto(self, state: int, token: int, fail: list[int]) -> int:
        while True:
            child = self._next[state].get(token)
            if child is not None:
                return child
            if state == ROOT:
                return ROOT
            state = fail[state]

    @property
    def num_states(self) -> int:
        return len(self._next)

    def step(self, state: int, token: int) -> tuple[float, int]:
        """(score change, next state) for appending ``token`` to a hypothesis in ``state``."""
        nxt = self._goto(state, token, self.fail)
        return self.node_score[nxt] - self.node_score[state] + self.output_score[nxt], nxt

    def finalize(self, state: int) -> float:
        """Score change at the end of decoding: a partial match gives back what it earned."""
        return -self.node_score[state]

    def arrays(self) -> dict[str, np.ndarray]:
        """The graph as flat arrays: children of state ``s`` are ``child_token/child_state``
        ``[child_start[s]:child_start[s + 1]]``, sorted by token."""
        starts = [0]
        tokens: list[int] = []
        states: list[int] = []
        for children in self._next:
            for token in sorted(children):
                tokens.append(token)
                states.append(children[token])
            starts.append(len(tokens))
        return {
            "child_start": np.asarray(starts, dtype=np.int64),
            "child_token": np.asarray(tokens, dtype=np.int64),
            "child_state": np.asarray(states, dtype=np.int64),
            "fail": np.asarray(self.fail, dtype=np.int64),
            "node_score": np.asarray(self.node_score, dtype=np.float64),
            "output_score": np.asarray(self.output_score, dtype=np.float64),
        }
