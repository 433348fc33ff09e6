"""Batch formation policies: limits, padding cap, priorities and the starvation bound."""

from __future__ import annotations

import attrs

from oasr.engine.scheduler import Scheduler


@attrs.define
class R:
    request_id: str
    cost: int
    seq: int
    priority: int = 0
    arrival: float = 0.0
    skipped: int = 0


def make(policy, **kw):
    args = dict(policy=policy, max_batch_size=4, max_batch_frames=None, max_pad_ratio=0.25, max_wait_time=0.0,
                starvation_limit=3)
    args.update(kw)
    return Scheduler(**args)


def ids(batch):
    return [r.request_id for r in batch]


def fill(s, costs, priorities=None):
    for i, c in enumerate(costs):
        s.add(R(f"r{i}", c, i, (priorities or [0] * len(costs))[i]))


def test_fcfs_takes_arrival_order_up_to_the_batch_size():
    s = make("fcfs")
    fill(s, [100, 900, 50, 400, 300])
    assert ids(s.schedule(flush=True)) == ["r0", "r1", "r2", "r3"]
    assert ids(s.schedule(flush=True)) == ["r4"]


def test_sjf_takes_the_shortest():
    s = make("sjf")
    fill(s, [100, 900, 50, 400, 300])
    assert ids(s.schedule(flush=True)) == ["r2", "r0", "r4", "r3"]


def test_bucket_groups_similar_lengths_under_the_padding_cap():
    s = make("bucket")
    fill(s, [100, 900, 110, 95, 880, 105])
    first = s.schedule(flush=True)
    assert ids(first) == ["r0", "r3", "r5", "r2"]  # nearest lengths, ties by arrival
    longest = max(r.cost for r in first)
    real = sum(r.cost for r in first)
    assert longest * len(first) - real <= 0.25 * real
    assert ids(s.schedule(flush=True)) == ["r1", "r4"]


def test_max_batch_frames_counts_padded_frames():
    s = make("fcfs", max_batch_frames=1000)
    fill(s, [300, 300, 300, 300])
    assert ids(s.schedule(flush=True)) == ["r0", "r1", "r2"]
    s = make("fcfs", max_batch_frames=100)
    fill(s, [300, 20])
    assert ids(s.schedule(flush=True)) == ["r0"]  # an oversize request still runs, alone


def test_priority_first():
    s = make("fcfs", max_batch_size=2)
    fill(s, [10, 10, 10], priorities=[0, 5, 1])
    assert ids(s.schedule(flush=True)) == ["r1", "r2"]


def test_starvation_bound():
    s = make("sjf", max_batch_size=1, starvation_limit=2)
    s.add(R("long", 1000, 0))
    for i in range(1, 6):
        s.add(R(f"short{i}", 10, i))
    order = [ids(s.schedule(flush=True))[0] for _ in range(6)]
    assert order.index("long") == 2  # passed over twice, then scheduled


def test_waits_for_a_fuller_batch_unless_flushed_or_old():
    s = make("fcfs", max_wait_time=10.0)
    s.add(R("a", 10, 0, arrival=100.0))
    assert s.schedule(flush=False, now=105.0) == []
    assert ids(s.schedule(flush=False, now=111.0)) == ["a"]
    s.add(R("b", 10, 1, arrival=200.0))
    assert ids(s.schedule(flush=True, now=200.0)) == ["b"]


def test_fixed_cost_ignores_padding():
    s = make("bucket", fixed_cost=True)
    fill(s, [3000, 3000, 3000, 3000, 3000])
    assert len(s.schedule(flush=True)) == 4
