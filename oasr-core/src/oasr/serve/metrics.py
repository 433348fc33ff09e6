"""Prometheus metrics of one server, on its own CollectorRegistry (two apps in a process never mix).

Exported (``GET /metrics``):

- ``oasr_requests_total{endpoint, outcome}``: finished requests; outcome is ``success``,
  ``bad_request``, ``unauthorized``, ``not_found``, ``too_large``, ``unsupported_media``,
  ``rate_limited``, ``unavailable``, ``timeout``, ``disconnected`` or ``error``
- ``oasr_request_latency_seconds{endpoint}``: arrival to response, successful requests
- ``oasr_first_output_latency_seconds{endpoint}``: arrival to the first transcript delta (streams)
- ``oasr_audio_seconds_total{endpoint}``: seconds of audio transcribed
- ``oasr_in_flight_requests``, ``oasr_realtime_sessions``: what is open now
- ``oasr_batch_size``: requests per engine batch (histogram)
- read from the engine at scrape time: ``oasr_engine_queue_depth``, ``oasr_engine_streams``,
  ``oasr_engine_batches_total``, ``oasr_engine_stage_seconds_total{stage}``
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

OUTCOMES = {200: "success", 400: "bad_request", 401: "unauthorized", 404: "not_found", 408: "timeout",
            413: "too_large",
            415: "unsupported_media", 429: "rate_limited", 503: "unavailable", 500: "error"}

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


def outcome_of(status: int) -> str:
    return OUTCOMES.get(status, "error" if status >= 500 else "bad_request")


class _EngineCollector(Collector):
    """Engine counters read at scrape time (nothing to keep in sync)."""

    def __init__(self, snapshot: Callable[[], dict[str, Any] | None]):
        self._snapshot = snapshot

    def collect(self) -> Iterator[Any]:
        snap = self._snapshot()
        if snap is None:
            return
        yield GaugeMetricFamily("oasr_engine_queue_depth", "requests waiting in the engine scheduler",
                                value=snap.get("queue_depth", 0))
        yield GaugeMetricFamily("oasr_engine_streams", "open streams in the streaming engine",
                                value=snap.get("streams", 0))
        yield CounterMetricFamily("oasr_engine_batches", "batches the engine has run", value=snap.get("batches", 0))
        stages = CounterMetricFamily("oasr_engine_stage_seconds", "engine time per stage", labels=["stage"])
        for stage, seconds in sorted(snap.get("stage_seconds", {}).items()):
            stages.add_metric([stage], seconds)
        yield stages


class ServerMetrics:
    def __init__(self, engine_snapshot: Callable[[], dict[str, Any] | None]):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("oasr_requests", "finished requests by endpoint and outcome",
                                ["endpoint", "outcome"], registry=r)
        self.latency = Histogram("oasr_request_latency_seconds", "arrival to response of successful requests",
                                 ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.first_output = Histogram("oasr_first_output_latency_seconds", "arrival to the first transcript delta",
                                      ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.audio_seconds = Counter("oasr_audio_seconds", "seconds of audio transcribed", ["endpoint"], registry=r)
        self.in_flight = Gauge("oasr_in_flight_requests", "requests admitted and not finished", registry=r)
        self.realtime_sessions = Gauge("oasr_realtime_sessions", "open realtime WebSocket sessions", registry=r)
        self.batch_size = Histogram("oasr_batch_size", "requests per engine batch", buckets=BATCH_BUCKETS, registry=r)
        r.register(_EngineCollector(engine_snapshot))

    def finished(self, endpoint: str, outcome: str, *, latency: float | None = None,
                 audio_seconds: float | None = None) -> None:
        self.requests.labels(endpoint, outcome).inc()
        if latency is not None and outcome == "success":
            self.latency.labels(endpoint).observe(latency)
        if audio_seconds:
            self.audio_seconds.labels(endpoint).inc(audio_seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
