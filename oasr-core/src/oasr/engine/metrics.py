"""Engine counters: what ``metrics_snapshot()`` and the server's /metrics report."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any


class EngineMetrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.admitted = 0
        self.audio_seconds = 0.0
        self.finished: Counter[str] = Counter()
        self.batches = 0
        self.batched_requests = 0
        self.max_batch_size = 0
        self.stage_seconds: Counter[str] = Counter()

    def on_admit(self, seconds: float) -> None:
        with self._lock:
            self.admitted += 1
            self.audio_seconds += seconds

    def on_audio(self, seconds: float) -> None:
        """Audio that arrived after admission (streams are fed piece by piece)."""
        with self._lock:
            self.audio_seconds += seconds

    def on_finish(self, reason: str) -> None:
        with self._lock:
            self.finished[reason] += 1

    def on_batch(self, size: int) -> None:
        with self._lock:
            self.batches += 1
            self.batched_requests += size
            self.max_batch_size = max(self.max_batch_size, size)

    def on_timings(self, timings: dict[str, float]) -> None:
        with self._lock:
            for stage, seconds in timings.items():
                self.stage_seconds[stage] += seconds

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            total = sum(self.stage_seconds.values())
            return {
                "requests_admitted": self.admitted,
                "requests_finished": dict(self.finished),
                "audio_seconds": self.audio_seconds,
                "batches": self.batches,
                "mean_batch_size": self.batched_requests / self.batches if self.batches else 0.0,
                "max_batch_size": self.max_batch_size,
                "stage_seconds": dict(self.stage_seconds),
                "stage_share": {k: v / total for k, v in self.stage_seconds.items()} if total else {},
            }
