"""Speech for the Whisper benchmarks: espeak-ng sentences in six voices (with their text), the repo's
sample.wav, beckett.wav, and a long recording of sentences joined by short pauses."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf

SAMPLE_RATE = 16000
BECKETT_TEXT = "Ever tried. Ever failed. No matter. Try again. Fail again. Fail better."
#: espeak-ng voices (accent + variant) and speaking rates, cycled over the sentences
VOICES = (("en-us", 130), ("en-gb", 150), ("en-us+f3", 140), ("en-gb-scotland", 135), ("en-us+m7", 160),
          ("en-029", 145))
SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Please call me back when you get this message.",
    "A journey of a thousand miles begins with a single step.",
    "She sells sea shells by the sea shore.",
    "The weather today is sunny with a light breeze.",
    "We will meet at the station at half past nine.",
    "Turn left at the second traffic light and keep going until you reach the old bridge.",
    "The library closes early on Sunday afternoons.",
    "Remember to water the plants before you leave.",
    "The meeting has been moved to next Thursday.",
    "Coffee is served in the main hall after the talk.",
    "Our train was delayed because of the heavy snow that fell overnight across the whole region.",
    "He bought a new bicycle for his daughter's birthday.",
    "The museum shows paintings from the last century.",
    "Please send me the report by the end of the day.",
    "The children played in the park until it got dark.",
    "Several students volunteered to clean the park.",
    "Yes.",
    "Good morning everyone.",
    "The committee will announce the results of the vote tomorrow morning after the final count.",
    "Bring a warm coat.",
    "The recipe calls for two cups of flour, one egg and a pinch of salt.",
    "I would like a table for four people at seven o'clock, please.",
    "The river flooded the fields near the village last spring.",
    "Scientists measured the temperature of the ocean at many different depths.",
    "Keep your ticket until the end of the journey.",
    "Thank you very much for your help.",
    "The old house at the end of the street has been empty for years, and nobody knows who owns it now.",
    "Put the books back on the shelf when you are done reading them.",
    "Our neighbours are planting apple trees in their garden this weekend.",
    "The airport is about forty minutes from the city centre by bus.",
    "Do you know where I can buy fresh bread around here?",
)


def words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]+", " ", text.lower().replace("-", " ")).split()


def edit_distance(ref: list[str], hyp: list[str]) -> int:
    prev = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        cur = [i] + [0] * len(hyp)
        for j, w in enumerate(hyp, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != w))
        prev = cur
    return prev[-1]


def corpus_wer(refs: list[str | None], hyps: list[str]) -> float:
    """Word errors over reference words, on clips that have a reference."""
    errors = total = 0
    for ref, hyp in zip(refs, hyps, strict=True):
        if ref is not None:
            errors += edit_distance(words(ref), words(hyp))
            total += len(words(ref))
    return errors / max(1, total)


def espeak(text: str, path: Path, voice: str = "en-us", rate: int = 130) -> np.ndarray:
    raw = subprocess.run(["espeak-ng", "-v", voice, "-s", str(rate), "--stdout", text], check=True,
                         capture_output=True).stdout
    subprocess.run(["sox", "-R", "-t", "wav", "-", "-r", str(SAMPLE_RATE), "-c", "1", "-b", "16", str(path)],
                   input=raw, check=True, capture_output=True)
    audio, _ = sf.read(str(path), dtype="float32")
    return audio


def short_clips() -> list[tuple[str, np.ndarray, str | None]]:
    """(name, audio, reference text or None): every sentence in its voice, sample.wav and beckett.wav."""
    if not (shutil.which("espeak-ng") and shutil.which("sox")):
        sys.exit("espeak-ng and sox are needed: apt-get install -y espeak-ng sox")
    import moonshine_onnx

    repo = Path(__file__).resolve().parents[1]
    sample_path = Path(os.environ.get("OASR_TEST_ASSETS", repo / ".cache" / "assets")) / "sample.wav"
    if not sample_path.is_file():
        sys.exit(f"{sample_path} missing: scripts/test.sh extracts it from the pyannote-audio wheel")
    beckett, _ = sf.read(str(Path(moonshine_onnx.__file__).parent / "assets" / "beckett.wav"), dtype="float32")
    sample, _ = sf.read(str(sample_path), dtype="float32")
    tmp = Path(tempfile.mkdtemp())
    clips = []
    for i, text in enumerate(SENTENCES):
        voice, rate = VOICES[i % len(VOICES)]
        clips.append((f"s{i:02d}-{voice}", espeak(text, tmp / f"s{i}.wav", voice, rate), text))
    clips += [("beckett", beckett, BECKETT_TEXT), ("sample", sample, None)]
    return clips


def long_recording(clips, minimum_seconds: float = 120.0) -> tuple[np.ndarray, str]:
    """The sentences (with beckett.wav) joined by 0.4 s pauses, repeated up to ``minimum_seconds``."""
    pause = np.zeros(int(0.4 * SAMPLE_RATE), np.float32)
    spoken = [(a, t) for name, a, t in clips if t is not None]
    parts, texts, seconds = [], [], 0.0
    while seconds < minimum_seconds:
        for audio, text in spoken:
            parts += [audio, pause]
            texts.append(text)
            seconds += (len(audio) + len(pause)) / SAMPLE_RATE
    return np.concatenate(parts), " ".join(texts)
