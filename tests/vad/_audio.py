"""Test speech for the VAD and long-form tests: espeak-ng sentences joined by known silences."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import attrs
import numpy as np

RATE = 16000

SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Speech recognition turns what you say into text.",
    "Please call Stella and ask her to bring these things with her from the store.",
    "A long pause follows this sentence.",
    "Numbers like seven, twelve and ninety nine are easy to say.",
    "The weather today is cold, with a chance of rain in the evening.",
    "Short one.",
    "She sells sea shells by the sea shore, and the shells she sells are sea shells.",
)


def espeak(text: str, out: Path, *, speed: int = 150) -> np.ndarray:
    """``text`` spoken by espeak-ng (en-us) as 16 kHz mono float32 (sox resamples)."""
    import soundfile as sf

    espeak_bin, sox_bin = shutil.which("espeak-ng"), shutil.which("sox")
    if espeak_bin is None or sox_bin is None:
        raise AssertionError("espeak-ng and sox are required (apt-get install -y espeak-ng sox)")
    raw = subprocess.run([espeak_bin, "-v", "en-us", "-s", str(speed), "--stdout", text], check=True,
                         capture_output=True).stdout
    subprocess.run([sox_bin, "-R", "-t", "wav", "-", "-r", str(RATE), "-c", "1", "-b", "16", str(out)], input=raw,
                   check=True, capture_output=True)
    audio, rate = sf.read(str(out), dtype="float32")
    assert rate == RATE
    return audio


@attrs.define
class Recording:
    """Sentences separated by silences: the audio and each sentence's ``[start, end)`` in samples."""

    audio: np.ndarray
    texts: list[str]
    spans: list[tuple[int, int]]


def join(clips: list[tuple[str, np.ndarray]], silences_s: list[float], *, noise: float = 0.002,
         seed: int = 0) -> Recording:
    """``silences_s[i]`` seconds of (faint noise) silence before clip i, and ``silences_s[-1]`` after the last."""
    assert len(silences_s) == len(clips) + 1
    rng = np.random.default_rng(seed)
    parts, spans, pos = [], [], 0
    for (_, audio), gap in zip(clips, silences_s[:-1], strict=True):
        gap_n = int(gap * RATE)
        parts += [np.zeros(gap_n, np.float32), audio.astype(np.float32)]
        spans.append((pos + gap_n, pos + gap_n + len(audio)))
        pos += gap_n + len(audio)
    parts.append(np.zeros(int(silences_s[-1] * RATE), np.float32))
    audio = np.concatenate(parts)
    audio = (audio + noise * rng.standard_normal(len(audio))).astype(np.float32)
    return Recording(audio, [t for t, _ in clips], spans)


def sentence_clips(out: Path, sentences=SENTENCES) -> list[tuple[str, np.ndarray]]:
    out.mkdir(parents=True, exist_ok=True)
    return [(text, espeak(text, out / f"s{i}.wav")) for i, text in enumerate(sentences)]
