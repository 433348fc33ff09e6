"""Offline batch formation: which waiting requests run together in the next step.

Policies order the candidates; one greedy fill then respects the batch limits:

``fcfs``
    arrival order.
``sjf``
    shortest first.
``bucket``
    the oldest request anchors the batch; the rest are the requests closest to it in length, so a
    batch carries little padding (at most ``max_pad_ratio`` of its real frames).

Priorities come before policy (higher first), and a request passed over ``starvation_limit`` times
is scheduled next whatever its length or priority.  A model with a fixed input window costs the
same for every row, so padding limits do not apply to it.  ``fits_memory(batch_size, longest_cost)``,
when given, vetoes a batch whose forward would not fit in memory (see :mod:`oasr.engine.memory`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol


class Schedulable(Protocol):
    request_id: str
    priority: int
    arrival: float
    seq: int
    cost: int  # feature frames this request contributes before padding
    skipped: int


class Scheduler:
    def __init__(self, *, policy: str, max_batch_size: int, max_batch_frames: int | None,
                 max_pad_ratio: float, max_wait_time: float, starvation_limit: int, fixed_cost: bool = False,
                 fits_memory: Callable[[int, int], bool] | None = None):
        self.policy = policy
        self.max_batch_size = max_batch_size
        self.max_batch_frames = max_batch_frames
        self.max_pad_ratio = max_pad_ratio
        self.max_wait_time = max_wait_time
        self.starvation_limit = starvation_limit
        self.fixed_cost = fixed_cost
        self.fits_memory = fits_memory
        self.waiting: dict[str, Schedulable] = {}

    def __len__(self) -> int:
        return len(self.waiting)

    def add(self, request: Schedulable) -> None:
        self.waiting[request.request_id] = request

    def remove(self, request_id: str) -> Schedulable | None:
        return self.waiting.pop(request_id, None)

    def _order(self) -> list[Schedulable]:
        reqs = list(self.waiting.values())
        starved = sorted((r for r in reqs if self.starvation_limit and r.skipped >= self.starvation_limit),
                         key=lambda r: r.seq)
        rest = [r for r in reqs if not (self.starvation_limit and r.skipped >= self.starvation_limit)]
        if self.policy == "fcfs":
            rest.sort(key=lambda r: (-r.priority, r.seq))
        elif self.policy == "sjf":
            rest.sort(key=lambda r: (-r.priority, r.cost, r.seq))
        else:  # bucket: anchor on the oldest of the top priority, then nearest lengths
            rest.sort(key=lambda r: (-r.priority, r.seq))
            if rest:
                anchor = rest[0]
                same = [r for r in rest[1:] if r.priority == anchor.priority]
                lower = [r for r in rest[1:] if r.priority != anchor.priority]
                same.sort(key=lambda r: (abs(r.cost - anchor.cost), r.seq))
                rest = [anchor, *same, *lower]
        return starved + rest

    def _fits(self, batch: list[Schedulable], candidate: Schedulable) -> bool:
        if len(batch) >= self.max_batch_size:
            return False
        if self.fits_memory is not None and not self.fits_memory(len(batch) + 1,
                                                                 max(candidate.cost, *(r.cost for r in batch))):
            return False
        if self.fixed_cost:
            if self.max_batch_frames is not None:
                return (len(batch) + 1) * max(candidate.cost, batch[0].cost) <= self.max_batch_frames
            return True
        longest = max(candidate.cost, max(r.cost for r in batch))
        padded = longest * (len(batch) + 1)
        if self.max_batch_frames is not None and padded > self.max_batch_frames:
            return False
        if self.policy == "bucket":
            real = candidate.cost + sum(r.cost for r in batch)
            if padded - real > self.max_pad_ratio * real:
                return False
        return True

    def schedule(self, *, flush: bool, now: float | None = None) -> list[Schedulable]:
        """The next batch (possibly empty when waiting for more requests is worthwhile)."""
        if not self.waiting:
            return []
        now = time.monotonic() if now is None else now
        if not flush and len(self.waiting) < self.max_batch_size:
            oldest = min(r.arrival for r in self.waiting.values())
            if now - oldest < self.max_wait_time:
                return []
        order = self._order()
        batch = [order[0]]
        for candidate in order[1:]:
            if self._fits(batch, candidate):
                batch.append(candidate)
        chosen = {r.request_id for r in batch}
        newest = max(r.seq for r in batch)
        for r in self.waiting.values():
            if r.request_id not in chosen and r.seq < newest:
                r.skipped += 1
        for r in batch:
            del self.waiting[r.request_id]
        return batch
