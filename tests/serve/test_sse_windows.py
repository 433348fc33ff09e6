"""``stream=true`` on an offline Whisper engine: a delta per decoded window, the first sent before the last
window is decoded.  Decoding is gated after the first reported window until the client has read a delta;
an implementation that sent everything at the end would leave the gate closed (the test reads the order
of events, with no timing threshold)."""

from __future__ import annotations

import json
import threading

import httpx
import numpy as np

from oasr.engine import Engine, EngineConfig
from tests.serve.harness import serving, wav_bytes

GATE_SECONDS = 60.0


def test_sse_sends_a_delta_per_window(tmp_path):
    from tests.models.hf.whisper import _helpers as h

    parts = [h.espeak(text, tmp_path / f"{i}.wav") for i, text in enumerate(h.ESPEAK_SENTENCES)]
    pause = np.zeros(12000, np.float32)
    audio = np.concatenate([x for _ in range(3) for p in parts for x in (p, pause)])
    assert len(audio) / 16000 > 65
    engine = Engine(EngineConfig())
    log: list = []
    first_delta = threading.Event()
    decode = engine.strategy.decode

    def gated_decode(batch):
        inner = batch.on_segments

        def on_segments(row, segments, seconds_done, language=None):
            inner(row, segments, seconds_done, language)
            log.append("window")
            if segments and not first_delta.wait(GATE_SECONDS):
                log.append("gate timed out")

        batch.on_segments = on_segments
        return decode(batch)

    engine.strategy.decode = gated_decode
    with serving(engine, served_model_names=("whisper-tiny.en",)) as server:
        files = {"file": ("long.wav", wav_bytes(audio), "audio/wav")}
        data = {"model": "whisper-tiny.en", "stream": "true"}
        with httpx.stream("POST", server.url + "/v1/audio/transcriptions", files=files, data=data,
                          timeout=300) as response:
            assert response.status_code == 200
            events = []
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                events.append(event)
                if event["type"] == "transcript.text.delta":
                    log.append("delta")
                    first_delta.set()
    assert "gate timed out" not in log
    windows = [i for i, e in enumerate(log) if e == "window"]
    deltas = [e for e in events if e["type"] == "transcript.text.delta"]
    assert len(windows) >= 3 and len(deltas) >= 3
    assert log.index("delta") < windows[-1]  # the first delta left before the last window was decoded
    done = events[-1]
    assert done["type"] == "transcript.text.done"
    assert "".join(d["delta"] for d in deltas).strip() == done["text"].strip()
