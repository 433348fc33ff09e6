"""Partial transcripts from an offline engine while a realtime buffer is still filling: a session opened with
``?partials=true`` gets ``oasr.input_audio_transcription.partial`` events (the buffer so far, transcribed)
before it commits; other sessions get exactly OpenAI's events."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
from websockets.asyncio.client import connect

from oasr.serve.realtime import PARTIAL_EVENT
from tests.serve.harness import MODEL_NAME, SAMPLE, WAIT
from tests.serve.test_realtime import AUTH, Session, chunks, expected_text, run, ws_url

CHUNK_SECONDS = 0.25
COMPLETED = "conversation.item.input_audio_transcription.completed"


@pytest.fixture(scope="module")
def pcm() -> np.ndarray:
    samples, rate = sf.read(SAMPLE, dtype="int16")
    return samples[: 3 * rate]


async def _session(server, pcm: np.ndarray, query: str, *, wait_for_partial: bool) -> tuple[list[dict], list[dict]]:
    """Events while appending (and, if asked, up to the first partial), then up to the completed event."""
    async with connect(ws_url(server, query), additional_headers=AUTH, open_timeout=WAIT) as ws:
        s = Session(ws)
        assert (await s.recv())["type"] == "session.created"
        await s.send("session.update", session={"type": "transcription", "audio": {"input": {
            "format": {"type": "audio/pcm", "rate": 16000}, "transcription": {"model": MODEL_NAME},
            "turn_detection": None}}})
        assert (await s.recv())["type"] == "session.updated"
        for chunk in chunks(pcm, 16000, CHUNK_SECONDS):
            await s.send("input_audio_buffer.append", audio=chunk)
        before = await s.until(PARTIAL_EVENT) if wait_for_partial else []
        await s.send("input_audio_buffer.commit")
        return before, await s.until(COMPLETED)


def test_partials_arrive_before_commit_and_are_the_buffer_so_far(server, reference, pcm):
    before, after = run(_session(server, pcm, "?partials=true", wait_for_partial=True))
    partial = before[-1]
    assert partial["type"] == PARTIAL_EVENT and partial["content_index"] == 0
    assert not any(e["type"] == "input_audio_buffer.committed" for e in before)
    step = int(16000 * CHUNK_SECONDS)
    prefixes = {expected_text(reference, pcm[:k], 16000) for k in range(16000, len(pcm) + 1, step)}
    assert partial["transcript"] in prefixes
    committed = next(e for e in after if e["type"] == "input_audio_buffer.committed")
    assert committed["item_id"] == partial["item_id"]
    completed = after[-1]
    deltas = "".join(e["delta"] for e in after if e["type"].endswith(".delta"))
    assert completed["transcript"] == deltas == expected_text(reference, pcm, 16000)


def test_without_the_query_parameter_no_partial_is_sent(server, reference, pcm):
    _, events = run(_session(server, pcm, "", wait_for_partial=False))
    assert [e for e in events if e["type"] == PARTIAL_EVENT] == []
    assert events[-1]["transcript"] == expected_text(reference, pcm, 16000)
