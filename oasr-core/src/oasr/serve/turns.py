"""Server-side turn detection for ``WS /v1/realtime``: ``turn_detection: {"type": "server_vad"}``.

OpenAI's ``server_vad`` rules on Silero VAD probabilities (512-sample windows of the input resampled
to 16 kHz): speech starts at the first window whose probability reaches ``threshold``; the item's
audio starts ``prefix_padding_ms`` before it (never before the previous turn's end).  Speech stops
once ``silence_duration_ms`` of windows below the threshold have followed; the item's audio ends
there, so it carries that silence.  Each turn is sent as ``input_audio_buffer.speech_started``
(``audio_start_ms``), ``input_audio_buffer.speech_stopped`` (``audio_end_ms``) and
``input_audio_buffer.committed``, then transcribed as its own item (its own engine stream: the
stream state is new for every turn; the session's language and prompt carry over).  Times count
milliseconds of audio appended since the session began.  Audio between turns is not transcribed.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import numpy as np

from oasr.vad.spans import WINDOW

VAD_RATE = 16000
TURN_KEYS = ("type", "threshold", "prefix_padding_ms", "silence_duration_ms", "create_response",
             "interrupt_response", "idle_timeout_ms")


class TurnConfigError(ValueError):
    """A ``turn_detection`` object this server cannot honour (the message names the key)."""

    def __init__(self, message: str, key: str):
        super().__init__(message)
        self.key = key


@attrs.frozen(kw_only=True)
class ServerVad:
    """OpenAI's ``server_vad`` settings, with its defaults."""

    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500

    def describe(self) -> dict[str, Any]:
        return {"type": "server_vad", "threshold": self.threshold, "prefix_padding_ms": self.prefix_padding_ms,
                "silence_duration_ms": self.silence_duration_ms}


def parse_turn_detection(value: Any) -> ServerVad | None:
    """``None`` (the client commits) or the ``server_vad`` settings; anything else raises TurnConfigError."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise TurnConfigError("'turn_detection' must be an object or null", "")
    unknown = sorted(set(value) - set(TURN_KEYS))
    if unknown:
        raise TurnConfigError(f"unsupported key(s) {', '.join(unknown)} in 'turn_detection'; supported: "
                              f"{', '.join(TURN_KEYS)}", unknown[0])
    if value.get("type", "server_vad") != "server_vad":
        raise TurnConfigError(f"turn_detection type {value.get('type')!r} is not supported; use 'server_vad' or null",
                              "type")
    fields: dict[str, Any] = {}
    threshold = value.get("threshold")
    if threshold is not None:
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 <= threshold <= 1.0:
            raise TurnConfigError(f"'turn_detection.threshold' must be a number in [0, 1], got {threshold!r}",
                                  "threshold")
        fields["threshold"] = float(threshold)
    for key in ("prefix_padding_ms", "silence_duration_ms"):
        item = value.get(key)
        if item is not None:
            if isinstance(item, bool) or not isinstance(item, int) or item < 0:
                raise TurnConfigError(f"'turn_detection.{key}' must be a non-negative integer, got {item!r}", key)
            fields[key] = item
    return ServerVad(**fields)


class TurnDetector:
    """Turn boundaries of a 16 kHz stream, in 16 kHz samples: ``push`` returns ``("start", pos)`` /
    ``("stop", pos)`` events in order."""

    def __init__(self, config: ServerVad, vad: Any = None):
        if vad is None:
            from oasr.vad import default_vad

            vad = default_vad()
        self.config = config
        self.stream = vad.stream()
        self.in_speech = False
        self.silent_windows = 0
        self.last_stop = 0
        self._silence_needed = max(1, -(-config.silence_duration_ms * VAD_RATE // (1000 * WINDOW)))
        self.prefix = config.prefix_padding_ms * VAD_RATE // 1000

    def push(self, samples: np.ndarray) -> list[tuple[str, int]]:
        first = self.stream.windows
        events: list[tuple[str, int]] = []
        for i, prob in enumerate(self.stream.push(samples)):
            window = first + i
            if not self.in_speech:
                if prob >= self.config.threshold:
                    self.in_speech, self.silent_windows = True, 0
                    events.append(("start", max(self.last_stop, window * WINDOW - self.prefix)))
            elif prob >= self.config.threshold:
                self.silent_windows = 0
            else:
                self.silent_windows += 1
                if self.silent_windows >= self._silence_needed:
                    self.in_speech = False
                    self.last_stop = (window + 1) * WINDOW
                    events.append(("stop", self.last_stop))
        return events


@attrs.define(eq=False)
class TurnTaker:
    """One session's server VAD: buffers input-rate audio, opens an item at each speech start and
    commits it at each stop, through the session's own append/commit paths."""

    config: ServerVad
    rate: int
    append: Callable[[np.ndarray], Awaitable[Any]]
    commit: Callable[[], Awaitable[None]]
    send: Callable[..., Awaitable[None]]
    current_item: Callable[[], Any]
    detector: TurnDetector = attrs.field(init=False)
    resampler: Any = attrs.field(init=False)
    #: input-rate audio kept from ``offset`` on (the prefix before a start; the turn being spoken)
    buffer: np.ndarray = attrs.field(init=False, factory=lambda: np.zeros(0, np.int16))
    offset: int = 0
    total: int = 0
    fed: int = 0

    def __attrs_post_init__(self) -> None:
        self.detector = TurnDetector(self.config)
        self.resampler = None
        if self.rate != VAD_RATE:
            import soxr

            self.resampler = soxr.ResampleStream(self.rate, VAD_RATE, 1, dtype="float32")

    def _to_input(self, pos16: int) -> int:
        return round(pos16 * self.rate / VAD_RATE)

    def _ms(self, pos: int) -> int:
        return round(pos * 1000 / self.rate)

    async def _feed(self, upto: int) -> None:
        if upto > self.fed:
            await self.append(self.buffer[self.fed - self.offset: upto - self.offset])
            self.fed = upto

    async def push(self, samples: np.ndarray) -> None:
        """Take appended PCM16 samples at the session's rate; open, feed and commit items as turns go."""
        self.buffer = np.concatenate([self.buffer, samples])
        self.total += len(samples)
        audio = samples.astype(np.float32) / 32768.0
        audio16 = self.resampler.resample_chunk(audio) if self.resampler is not None else audio
        events = [(kind, min(self.total, self._to_input(pos16))) for kind, pos16 in self.detector.push(audio16)]
        # an item gets audio up to where the VAD has scored it, so it ends exactly at its stop
        scored = min(self.total, self._to_input(self.detector.stream.windows * WINDOW))
        for index, (kind, pos) in enumerate(events):
            if kind == "start":
                self.fed = start = max(pos, self.offset)
                upto = events[index + 1][1] if index + 1 < len(events) else scored
                await self._feed(min(upto, start + WINDOW))  # opens the item
                item = self.current_item()
                await self.send("input_audio_buffer.speech_started", audio_start_ms=self._ms(start),
                                item_id=item.item_id if item is not None else None)
                await self._feed(upto)
            else:
                await self._feed(pos)
                item = self.current_item()
                await self.send("input_audio_buffer.speech_stopped", audio_end_ms=self._ms(pos),
                                item_id=item.item_id if item is not None else None)
                if item is not None:
                    item.stopped = time.perf_counter()
                    await self.commit()
        if self.detector.in_speech:
            await self._feed(scored)
        else:  # keep only what the next turn's prefix can reach
            keep = self._to_input(self.detector.prefix) + 4 * WINDOW
            drop = max(0, len(self.buffer) - keep)
            self.buffer, self.offset = self.buffer[drop:], self.offset + drop
            self.fed = max(self.fed, self.offset)


_TURN_LATENCY: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def observe_turn_latency(metrics: Any, seconds: float) -> None:
    """Record speech stop → final transcript of a server-VAD turn (``oasr_realtime_turn_latency_seconds``)."""
    histogram = _TURN_LATENCY.get(metrics.registry)
    if histogram is None:
        from prometheus_client import Histogram

        histogram = _TURN_LATENCY[metrics.registry] = Histogram(
            "oasr_realtime_turn_latency_seconds", "server VAD: end of a turn's speech to its completed transcript",
            registry=metrics.registry)
    histogram.observe(seconds)
