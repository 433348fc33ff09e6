"""``engine.transcribe_iter(audio)``: segments as they are decoded, in faster-whisper's ``segments, info`` shape.

The request is queued with an ``on_segments`` callback and a thread steps the engine; the returned
generator yields each segment as soon as its window is final, while later windows still decode.  A decode strategy that does not report
windows yields all segments when the request finishes.  ``info`` is filled before the call returns
(the first window decoded, or the request done): ``language`` and ``duration`` like faster-whisper's
``TranscriptionInfo``; ``language_probability`` is None where the strategy does not report one.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

import attrs

from oasr.decoding.types import Segment
from oasr.engine.options import DecodingOptions, RequestOutput
from oasr.errors import RequestError


@attrs.define
class TranscriptionInfo:
    """What is known about a request besides its segments."""

    language: str | None
    language_probability: float | None
    duration: float
    #: seconds of the audio decoded so far (``duration`` once iteration ends)
    seconds_done: float = 0.0
    #: the final output, once the request has finished
    output: RequestOutput | None = None


def transcribe_iter(engine: Any, audio: Any, *, decoding: DecodingOptions | None = None,
                    sample_rate: int | None = None) -> tuple[Iterator[Segment], TranscriptionInfo]:
    events: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
    samples = engine.load_audio(audio, sample_rate)
    info = TranscriptionInfo(language=None, language_probability=None,
                             duration=round(len(samples) / engine.sample_rate, 3))
    finished = threading.Event()

    def on_done(output: RequestOutput) -> None:
        finished.set()
        events.put(("done", output))

    request_id = engine.add_request(samples, decoding=decoding, sample_rate=engine.sample_rate, callback=on_done,
                                    on_segments=lambda segs, done, lang: events.put(("segments", (list(segs), done,
                                                                                                   lang))))

    def drive() -> None:  # the engine steps here, so segments reach the caller while later windows decode
        try:
            while not finished.is_set() and engine.has_unfinished_requests():
                engine.step(flush=True)
        except BaseException as exc:  # surfaced to the iterating caller
            events.put(("raised", exc))

    stepper = threading.Thread(target=drive, name="oasr-transcribe-iter", daemon=True)
    stepper.start()
    first = events.get()  # the first window (or the whole request): the language is known before iteration
    if first[0] == "segments":
        info.language = first[1][2]
    elif first[0] == "done":
        info.language = first[1].language

    def segments() -> Iterator[Segment]:
        try:
            yield from _events(first)
        finally:
            # the stepping thread must be gone before the caller moves on (an interpreter exiting under a
            # daemon thread inside a forward aborts the process): a caller that stopped early aborts the request
            if not finished.is_set():
                engine.abort_request(request_id)
            stepper.join()

    def _events(event: tuple[str, Any]) -> Iterator[Segment]:
        yielded = 0
        while True:
            kind, payload = event
            if kind == "raised":
                raise payload
            if kind == "done":
                output: RequestOutput = payload
                info.output, info.seconds_done = output, info.duration
                if output.finish_reason == "error":
                    raise RequestError(f"transcription failed: {output.error}", request_id=output.request_id)
                yield from (output.segments or [])[yielded:]  # strategies that report no windows
                return
            new, info.seconds_done, language = payload
            info.language = info.language or language
            for segment in new:
                yielded += 1
                yield segment
            event = events.get()

    return segments(), info
