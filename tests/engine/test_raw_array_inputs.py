"""Raw arrays at another rate or with channels on either axis are handled, or refused / explained: never a
silent empty transcript.  Uses the embedded Whisper tiny.en on the repository's espeak sample."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import soundfile as sf
import soxr
import torch

from oasr.engine import Engine, EngineConfig
from oasr.errors import AudioError, TranscriptionError
from tests.helpers import REPO


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(EngineConfig())


@pytest.fixture(scope="module")
def speech48() -> np.ndarray:
    """6 s of the sample as 48 kHz mono float32."""
    samples, rate = sf.read(REPO / "samples" / "sample.wav", dtype="float32")
    assert rate == 16000
    return soxr.resample(samples[: 6 * rate], rate, 48000).astype(np.float32)


@pytest.fixture(scope="module")
def expected(engine, speech48) -> str:
    """The 48 kHz audio brought to 16 kHz as the engine does (soxr HQ), transcribed."""
    text = engine.transcribe(soxr.resample(speech48, 48000, 16000, quality="HQ").astype(np.float32))
    assert "speech recognition" in text
    return text


def test_soundfile_and_torchaudio_style_pairs_are_one_input_at_their_rate(engine, speech48, expected):
    buf = io.BytesIO()
    sf.write(buf, np.stack([speech48, speech48], axis=1), 48000, format="WAV", subtype="FLOAT")
    buf.seek(0)
    pair = sf.read(buf, dtype="float32")  # ((N, 2) array, 48000)
    assert pair[0].shape[1] == 2 and pair[1] == 48000
    assert engine.transcribe(pair) == expected
    channels_first = (torch.from_numpy(np.stack([speech48, speech48])), 48000)  # torchaudio.load's shape
    assert engine.transcribe([pair, channels_first]) == [expected, expected]
    segments, info = engine.transcribe_iter(pair)
    assert " ".join(s.text.strip() for s in segments) == expected.strip() and info.duration == pytest.approx(6.0)


def test_channels_on_either_axis_with_a_declared_rate(engine, speech48, expected):
    stereo = np.stack([speech48, speech48])
    assert engine.transcribe(stereo, sample_rate=48000) == expected
    assert engine.transcribe(np.ascontiguousarray(stereo.T), sample_rate=48000) == expected
    pcm = (stereo.T * 32767).astype(np.int16)
    assert "speech recognition" in engine.transcribe(pcm, sample_rate=48000)


def test_conflicting_rates_and_sample_lists_are_refused(engine, speech48):
    with pytest.raises(TranscriptionError) as caught:
        engine.transcribe((speech48, 48000), sample_rate=16000)
    assert "comes as (samples, 48000) but sample_rate=16000 was also given" in str(caught.value)
    with pytest.raises(AudioError) as listed:
        engine.transcribe(speech48[:16000].tolist())
    assert "got a list of 16000 numbers" in str(listed.value) and "np.asarray" in str(listed.value)


def test_an_empty_transcript_of_an_undeclared_rate_says_how_to_fix_it(engine, speech48):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        text = engine.transcribe(speech48)  # 48 kHz samples read as 16 kHz: slowed down threefold
    hints = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning) and "sample_rate" in str(w.message)]
    assert text.strip() == ""
    assert len(hints) == 1 and "read at the model's 16000 Hz" in hints[0], [str(w.message) for w in caught]
    with warnings.catch_warnings(record=True) as quiet:
        warnings.simplefilter("always")
        assert engine.transcribe(np.zeros(32000, np.float32)).strip() == ""  # silence: empty is right
    assert not [w for w in quiet if "sample_rate" in str(w.message)]
