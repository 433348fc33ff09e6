"""Speech spans from per-window speech probabilities (the Silero VAD rules faster-whisper applies).

The rules are a small state machine over 512-sample windows followed by padding; the result is
the same list of ``[start, end)`` sample spans faster-whisper's ``get_speech_timestamps`` returns for
the same probabilities and options, to the sample.  Positions are window starts (``512 * i``); a
recorded position of 0 means "none" (a speech span always starts before any end it records, so
no real end or restart is at sample 0).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from oasr.vad.options import SpeechSpan, VadOptions

WINDOW = 512
#: a span longer than ``max_speech_duration_s`` is cut at its last silence longer than this
MIN_SILENCE_AT_MAX_SPEECH_MS = 98


class _Machine:
    """Walks the windows, collecting raw (unpadded) spans as [start, end] lists."""

    def __init__(self, options: VadOptions, sample_rate: int):
        pad = sample_rate * options.speech_pad_ms / 1000
        self.on = options.threshold
        self.off = options.silence_threshold
        self.min_speech = sample_rate * options.min_speech_duration_ms / 1000
        self.max_speech = sample_rate * options.max_speech_duration_s - WINDOW - 2 * pad
        self.min_silence = sample_rate * options.min_silence_duration_ms / 1000
        self.min_silence_at_max = sample_rate * MIN_SILENCE_AT_MAX_SPEECH_MS / 1000
        self.spans: list[list[int]] = []
        self.triggered = False
        self.start: int | None = None
        self.temp_end = 0  # where the current run of silence began (0: not in silence)
        self.prev_end = 0  # the last silence long enough to cut at when the span gets too long
        self.next_start = 0  # where speech resumed after prev_end

    def _close(self, end: int) -> None:
        self.spans.append([self.start, end])
        self.start = None
        self.prev_end = self.next_start = self.temp_end = 0

    def step(self, i: int, prob: float) -> None:
        pos = WINDOW * i
        if prob >= self.on and self.temp_end:
            self.temp_end = 0
            if self.next_start < self.prev_end:
                self.next_start = pos
        if prob >= self.on and not self.triggered:
            self.triggered = True
            self.start = pos
            return
        if self.triggered and pos - self.start > self.max_speech:
            if self.prev_end:
                resume, cut = self.next_start, self.prev_end
                self._close(cut)
                if resume < cut:  # silent since the cut: the span is over
                    self.triggered = False
                else:  # speech resumed after the cut: a new span starts there
                    self.start = resume
            else:  # no silence to cut at: cut hard here
                self._close(pos)
                self.triggered = False
                return
        if prob < self.off and self.triggered:
            if not self.temp_end:
                self.temp_end = pos
            if pos - self.temp_end > self.min_silence_at_max:
                self.prev_end = self.temp_end
            if pos - self.temp_end < self.min_silence:
                return
            if self.temp_end - self.start > self.min_speech:
                self.spans.append([self.start, self.temp_end])
            self.start = None
            self.prev_end = self.next_start = self.temp_end = 0
            self.triggered = False

    def finish(self, num_samples: int) -> list[list[int]]:
        if self.start is not None and num_samples - self.start > self.min_speech:
            self.spans.append([self.start, num_samples])
        return self.spans


def _pad(spans: list[list[int]], pad: float, num_samples: int) -> None:
    """Widen each span by ``pad`` samples, or by half the gap when neighbours are closer than 2 pads."""
    for i, span in enumerate(spans):
        if i == 0:
            span[0] = int(max(0, span[0] - pad))
        if i == len(spans) - 1:
            span[1] = int(min(num_samples, span[1] + pad))
            continue
        after = spans[i + 1]
        gap = after[0] - span[1]
        if gap < 2 * pad:
            span[1] += int(gap // 2)
            after[0] = int(max(0, after[0] - gap // 2))
        else:
            span[1] = int(min(num_samples, span[1] + pad))
            after[0] = int(max(0, after[0] - pad))


def speech_spans(probs: Sequence[float] | np.ndarray, num_samples: int, options: VadOptions | None = None,
                 sample_rate: int = 16000) -> list[SpeechSpan]:
    """Speech spans of ``num_samples`` samples of audio from its per-window speech probabilities."""
    options = options or VadOptions()
    machine = _Machine(options, sample_rate)
    # float32 scalars compared with Python-float thresholds, as faster-whisper compares them (the
    # promotion rules of the installed numpy then decide a probability equal to a threshold alike)
    for i, prob in enumerate(np.asarray(probs, dtype=np.float32).reshape(-1)):
        machine.step(i, prob)
    spans = machine.finish(num_samples)
    _pad(spans, sample_rate * options.speech_pad_ms / 1000, num_samples)
    return [SpeechSpan(int(s), int(e)) for s, e in spans]
