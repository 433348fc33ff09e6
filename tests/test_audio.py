"""oasr.audio.load: every container/codec and rate decodes to the same 16 kHz mono signal; bad input
gets an AudioError naming the source and the reason.

The encoded files are made here, with soundfile (WAV, FLAC, OGG/Vorbis, MP3) and PyAV (m4a/AAC,
webm/Opus).  Lossless formats must reproduce the reference to quantization + resampler accuracy;
lossy ones are compared after finding the codec's delay (encoder priming), by correlation and level.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import av
import numpy as np
import pytest
import soundfile as sf
import torch

from oasr import audio
from oasr.errors import AudioError

RATES = [8000, 22050, 44100, 48000]
SECONDS = 1.0


def _voice(rate: int) -> np.ndarray:
    """Tones below 3.5 kHz (representable at 8 kHz) with a slow envelope, evaluated at ``rate``."""
    t = np.arange(int(rate * SECONDS)) / rate
    envelope = 0.6 + 0.4 * np.sin(2 * np.pi * 2.0 * t)
    chirp = np.sin(2 * np.pi * (300 * t + 1200 * t**2))  # 300 Hz → 2.7 kHz: makes the delay unambiguous
    x = envelope * (0.2 * np.sin(2 * np.pi * 440 * t) + 0.12 * np.sin(2 * np.pi * 1234 * t + 1.0)
                    + 0.06 * np.sin(2 * np.pi * 3100 * t) + 0.15 * chirp)
    return x.astype(np.float32)


def _side(rate: int) -> np.ndarray:
    t = np.arange(int(rate * SECONDS)) / rate
    return (0.1 * np.sin(2 * np.pi * 700 * t)).astype(np.float32)


def _source_signal(rate: int, channels: int) -> np.ndarray:
    """Mono: the voice.  Stereo: voice ± side, so only a true average of the channels gives the voice."""
    voice = _voice(rate)
    if channels == 1:
        return voice
    side = _side(rate)
    return np.stack([voice + side, voice - side], axis=1)


def _encode_soundfile(x: np.ndarray, rate: int, fmt: str, subtype: str) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, x, rate, format=fmt, subtype=subtype)
    return buffer.getvalue()


def _encode_av(x: np.ndarray, rate: int, container: str, codec: str, codec_rate: int | None = None) -> bytes:
    layout = "stereo" if x.ndim == 2 else "mono"
    planes = np.ascontiguousarray(x.T if x.ndim == 2 else x[None])
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=container) as out:
        stream = out.add_stream(codec, rate=codec_rate or rate, layout=layout)
        frame = av.AudioFrame.from_ndarray(planes, format="fltp", layout=layout)
        frame.sample_rate = rate
        resampler = av.AudioResampler(format=stream.codec_context.format.name, layout=layout,
                                      rate=codec_rate or rate, frame_size=stream.codec_context.frame_size or None)
        for chunk in resampler.resample(frame) + resampler.resample(None):
            for packet in stream.encode(chunk):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buffer.getvalue()


FORMATS = {
    # name: (encoder, lossless max error, lossy?)
    "wav-u8": (lambda x, r: _encode_soundfile(x, r, "WAV", "PCM_U8"), 2.5e-2, False),
    "wav-16": (lambda x, r: _encode_soundfile(x, r, "WAV", "PCM_16"), 2e-3, False),
    "wav-24": (lambda x, r: _encode_soundfile(x, r, "WAV", "PCM_24"), 2e-3, False),
    "wav-float": (lambda x, r: _encode_soundfile(x, r, "WAV", "FLOAT"), 2e-3, False),
    "flac": (lambda x, r: _encode_soundfile(x, r, "FLAC", "PCM_24"), 2e-3, False),
    "ogg-vorbis": (lambda x, r: _encode_soundfile(x, r, "OGG", "VORBIS"), None, True),
    "mp3": (lambda x, r: _encode_soundfile(x, r, "MP3", "MPEG_LAYER_III"), None, True),
    "m4a-aac": (lambda x, r: _encode_av(x, r, "ipod", "aac"), None, True),
    "webm-opus": (lambda x, r: _encode_av(x, r, "webm", "libopus", codec_rate=48000), None, True),
}


def _best_lag(decoded: np.ndarray, reference: np.ndarray, max_lag: int = 3000) -> int:
    """The delay of ``decoded`` relative to ``reference`` (codec priming), by cross-correlation."""
    core = reference[2000:-2000]
    best, best_score = 0, -np.inf
    for lag in range(-max_lag, max_lag + 1):
        window = decoded[2000 + lag:2000 + lag + core.size]
        if 2000 + lag < 0 or window.size < core.size:
            continue
        score = np.dot(window, core) / (np.linalg.norm(window) + 1e-12)
        if score > best_score:
            best, best_score = lag, score
    return best


def _delay(x: np.ndarray, frac: float) -> np.ndarray:
    """``x`` delayed by a fraction of a sample (an AAC priming of 1024 samples at 44.1 kHz is not a whole
    number of 16 kHz samples)."""
    spectrum = np.fft.rfft(x)
    return np.fft.irfft(spectrum * np.exp(-2j * np.pi * np.fft.rfftfreq(x.size) * frac), n=x.size)


@pytest.mark.parametrize("channels", [1, 2], ids=["mono", "stereo"])
@pytest.mark.parametrize("rate", RATES)
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_every_format_rate_and_layout_decodes_to_the_same_16k_signal(fmt, rate, channels):
    encode, max_error, lossy = FORMATS[fmt]
    decoded = audio.load(encode(_source_signal(rate, channels), rate), 16000)
    reference = _voice(16000)
    assert decoded.dtype == np.float32 and decoded.ndim == 1
    edge = 320  # resampler transients at the ends
    if not lossy:
        assert decoded.size == reference.size
        err = np.abs(decoded[edge:-edge] - reference[edge:-edge]).max()
        assert err < max_error, f"max error {err:.2e}"
        return
    # lossy: the codec adds priming (and rounds the length to its frame size); align, then compare
    assert reference.size <= decoded.size <= reference.size + 16000 * 0.25
    lag = _best_lag(decoded, reference)
    aligned = decoded[max(lag, 0):][: reference.size - max(-lag, 0)]
    ref = reference[max(-lag, 0):][: aligned.size]
    core = slice(2000, aligned.size - 2000)
    correlation = max(np.corrcoef(_delay(aligned, frac)[core], ref[core])[0, 1] for frac in np.linspace(-0.5, 0.5, 9))
    level = np.sqrt(np.mean(aligned[core] ** 2) / np.mean(ref[core] ** 2))
    assert correlation > 0.99, f"correlation {correlation:.4f} at lag {lag}"
    assert 0.85 < level < 1.15, f"level ratio {level:.3f}"


def test_paths_file_objects_arrays_and_tensors(tmp_path):
    voice = _voice(22050)
    path = tmp_path / "voice.flac"
    sf.write(path, voice, 22050, subtype="PCM_24")
    from_path = audio.load(path)
    for source in (str(path), Path(path), path.read_bytes(), bytearray(path.read_bytes()),
                   memoryview(path.read_bytes())):
        np.testing.assert_array_equal(audio.load(source), from_path)
    with open(path, "rb") as f:
        np.testing.assert_array_equal(audio.load(f), from_path)
    np.testing.assert_allclose(audio.load(voice, sample_rate=22050), from_path, atol=2e-4)
    np.testing.assert_allclose(audio.load(torch.from_numpy(voice), sample_rate=22050), from_path, atol=2e-4)
    int16 = np.round(voice * 32767).astype(np.int16)
    np.testing.assert_allclose(audio.load(int16, sample_rate=22050), from_path, atol=2e-4)
    stereo = np.stack([voice, voice])
    np.testing.assert_allclose(audio.load(stereo, sample_rate=22050), from_path, atol=2e-4)
    np.testing.assert_allclose(audio.load(stereo.T.copy(), sample_rate=22050), from_path, atol=2e-4)
    at_target = _voice(16000)
    np.testing.assert_array_equal(audio.load(at_target), at_target)  # no rate given: already at the target
    assert audio.duration_seconds(path) == pytest.approx(SECONDS)
    assert audio.duration_seconds(voice, sample_rate=22050) == pytest.approx(SECONDS)
    m4a = _encode_av(_voice(44100), 44100, "ipod", "aac")
    assert 1.0 <= audio.duration_seconds(m4a) < 1.1


def _video_only_mp4() -> bytes:
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as out:
        stream = out.add_stream("mpeg4", rate=10)
        stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
        for _ in range(3):
            for packet in stream.encode(av.VideoFrame.from_ndarray(np.zeros((32, 32, 3), np.uint8), format="rgb24")):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buffer.getvalue()


def _wav_bytes(x: np.ndarray, rate: int = 16000) -> bytes:
    return _encode_soundfile(x, rate, "WAV", "PCM_16")


BAD_INPUTS = [
    ("missing file", lambda tmp: tmp / "nope.wav", {}, "does not exist"),
    ("a directory", lambda tmp: tmp, {}, "not a file"),
    ("zero bytes", lambda tmp: b"", {}, "empty"),
    ("garbage bytes", lambda tmp: b"this is not audio at all" * 40, {}, "could not decode"),
    ("truncated header", lambda tmp: _wav_bytes(_voice(16000))[:20], {}, "could not decode"),
    ("video without audio", lambda tmp: _video_only_mp4(), {}, "no audio stream"),
    ("wav with no samples", lambda tmp: _wav_bytes(np.zeros(0, np.float32)), {}, "no samples"),
    ("empty array", lambda tmp: np.zeros(0, np.float32), {}, "no samples"),
    ("NaN samples", lambda tmp: np.array([0.1, np.nan, 0.2], np.float32), {}, "non-finite"),
    ("Inf samples", lambda tmp: torch.tensor([0.1, float("inf")]), {}, "non-finite"),
    ("complex dtype", lambda tmp: np.ones(100, np.complex64), {}, "dtype"),
    ("bool dtype", lambda tmp: np.ones(100, bool), {}, "dtype"),
    ("three dimensions", lambda tmp: np.zeros((2, 2, 100), np.float32), {}, "dimensions"),
    ("ambiguous layout", lambda tmp: np.zeros((300, 300), np.float32), {}, "channels"),
    ("int16-scaled floats", lambda tmp: _voice(16000) * 32767, {}, "peak"),
    ("zero sample rate", lambda tmp: _voice(16000), {"sample_rate": 0}, "sample_rate"),
    ("negative sample rate", lambda tmp: _voice(16000), {"sample_rate": -16000}, "sample_rate"),
    ("NaN sample rate", lambda tmp: _voice(16000), {"sample_rate": float("nan")}, "sample_rate"),
    ("zero target rate", lambda tmp: _voice(16000), {"target_rate": 0}, "target_rate"),
    ("rate given for encoded audio", lambda tmp: _wav_bytes(_voice(16000)), {"sample_rate": 8000}, "raw arrays"),
    ("too long array", lambda tmp: _voice(16000), {"max_seconds": 0.5}, "limit"),
    ("too long file", lambda tmp: _wav_bytes(_voice(16000)), {"max_seconds": 0.5}, "limit"),
    ("too long m4a", lambda tmp: _encode_av(_voice(16000), 16000, "ipod", "aac"), {"max_seconds": 0.5}, "limit"),
    ("text-mode file", lambda tmp: io.StringIO("RIFF"), {}, "text mode"),
    ("unsupported type", lambda tmp: 12345, {}, "unsupported type"),
]


@pytest.mark.parametrize("make, kwargs, reason", [b[1:] for b in BAD_INPUTS], ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_gets_its_audio_error(tmp_path, make, kwargs, reason):
    source = make(tmp_path)
    with pytest.raises(AudioError, match=reason) as err:
        audio.load(source, **kwargs)
    assert err.value.source == audio.describe_source(source)
    assert audio.describe_source(source) in str(err.value)


def test_max_seconds_from_the_environment(monkeypatch):
    monkeypatch.setenv("OASR_MAX_AUDIO_SECONDS", "0.25")
    with pytest.raises(AudioError, match="limit of 0.25 s"):
        audio.load(_voice(16000))
    assert audio.load(_voice(16000), max_seconds=2.0).size == 16000


# -- decoded-size limits (the decode is streamed; limits hold before and while decoding) ---------------------
def _write_silence(path: Path, rate: int, channels: int, seconds: int, fmt: str = "FLAC") -> Path:
    block = np.zeros((rate, channels), dtype=np.int16)
    with sf.SoundFile(path, "w", samplerate=rate, channels=channels, format=fmt, subtype="PCM_16") as f:
        for _ in range(seconds):
            f.write(block)
    return path


_RSS_PROBE = """
import resource, sys
import numpy as np, soundfile, soxr
from oasr import audio
audio.load(np.zeros(1600, np.float32))  # warm the import paths
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
samples = audio.load(sys.argv[1])
print(samples.size, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) // 1024)
"""


def test_an_eight_channel_96k_bomb_decodes_in_bounded_memory(tmp_path):
    """476 KB of FLAC (8 channels, 96 kHz, 600 s of silence): the peak RSS growth of the decode stays
    within 300 MB (decoding it whole needed ~2 GB: 8 × 96,000 × 600 float32 samples)."""
    import subprocess
    import sys

    bomb = _write_silence(tmp_path / "bomb.flac", 96000, 8, 600)
    assert bomb.stat().st_size < 2**20
    done = subprocess.run([sys.executable, "-c", _RSS_PROBE, str(bomb)], capture_output=True, text=True,
                          timeout=300, check=True)
    size, growth_mb = map(int, done.stdout.split())
    assert size == 600 * 16000
    assert growth_mb < 300, f"decoding grew the peak RSS by {growth_mb} MB"


def test_the_duration_limit_refuses_from_metadata_before_decoding(tmp_path, monkeypatch):
    bomb = _write_silence(tmp_path / "long.flac", 96000, 8, 40)
    monkeypatch.setattr(audio._Decoded, "add", lambda *a: pytest.fail("decoded a sample"))
    with pytest.raises(AudioError, match=r"is 40 s long, over the limit of 30 s"):
        audio.load(bomb, max_seconds=30)


def test_the_decoded_size_budget_refuses_many_channels_at_a_high_rate(tmp_path):
    """20 s at 8 × 96 kHz is 15.4 M decoded samples: under a 60 s limit the budget is 5.76 M."""
    wide = _write_silence(tmp_path / "wide.flac", 96000, 8, 20)
    with pytest.raises(AudioError, match="decoded-size budget"):
        audio.load(wide, max_seconds=60)
    assert audio.load(wide, max_seconds=200).size == 20 * 16000  # the same file under a longer limit


def test_the_limits_hold_while_decoding_whatever_the_metadata_said():
    """A stream without a trustworthy length (no duration in the container): the decoder counts."""
    sink = audio._Decoded("x", 16000, 2.0, math.inf, "hint")
    with pytest.raises(AudioError, match="longer than the limit of 2 s"):
        for _ in range(5):
            sink.add(np.zeros((1, 16000), np.float32), 16000)
    budget = audio._Decoded("x", 16000, 60.0, 4 * 48000, "hint")
    with pytest.raises(AudioError, match="decoded-size budget"):
        for _ in range(5):
            budget.add(np.zeros((8, 48000), np.float32), 48000)


def test_a_file_labelled_one_hertz_is_refused(tmp_path):
    """6.4 KB of .au at 1 Hz would be upsampled to 53 minutes of audio."""
    buffer = io.BytesIO()
    sf.write(buffer, np.zeros(3200, np.int16), 1, format="AU", subtype="PCM_16")
    with pytest.raises(AudioError, match="below the minimum of 4000 Hz"):
        audio.load(buffer.getvalue())
    with pytest.raises(AudioError, match="below the minimum"):
        audio.load(np.zeros(3200, np.float32), sample_rate=1)


@pytest.mark.parametrize("scale", [32767.0, 1e30])
def test_out_of_range_float_files_are_refused(scale):
    """Float WAVs scaled like int16 (or absurdly) are refused, as float arrays already were."""
    data = _encode_soundfile(_voice(16000) * np.float32(scale), 16000, "WAV", "FLOAT")
    with pytest.raises(AudioError, match="float samples must lie in"):
        audio.load(data)
    in_range = _encode_soundfile(_voice(16000), 16000, "WAV", "FLOAT")
    np.testing.assert_allclose(audio.load(in_range), _voice(16000), atol=1e-6)


def test_a_bad_duration_limit_in_the_environment_is_an_audio_error(monkeypatch):
    monkeypatch.setenv("OASR_MAX_AUDIO_SECONDS", "forever")
    with pytest.raises(AudioError, match="OASR_MAX_AUDIO_SECONDS must be a positive number of seconds"):
        audio.load(_voice(16000))
