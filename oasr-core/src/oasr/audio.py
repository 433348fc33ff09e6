"""Audio input: any supported source → mono float32 samples in [-1, 1] at the model's rate.

:func:`load` accepts a path (``str`` / ``Path``), encoded bytes, a binary file object, a numpy array or a
torch tensor.  Encoded audio is decoded by soundfile (WAV, FLAC, OGG/Vorbis/Opus, MP3, ...) and, for
whatever libsndfile cannot read, by FFmpeg through PyAV (m4a/AAC, mp4, webm, opus, ...).  Channels are
averaged to mono and the signal is resampled with soxr (``HQ``).  Integer PCM arrays are scaled to
[-1, 1] (int16 / 32768 ...); float arrays must already be in that range.

Anything unusable raises :class:`oasr.errors.AudioError` naming the source and the reason: a missing or
undecodable file, no audio stream, zero samples, NaN/Inf samples, an unsupported dtype, more than two
dimensions or an ambiguous channel layout, a non-positive sample rate, float samples far outside
[-1, 1], or audio longer than ``max_seconds`` (default :data:`DEFAULT_MAX_SECONDS`, or the
``OASR_MAX_AUDIO_SECONDS`` environment variable).
"""

from __future__ import annotations

import io
import math
import os
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from oasr.errors import AudioError

#: longest audio :func:`load` accepts unless told otherwise (seconds)
DEFAULT_MAX_SECONDS = 4 * 3600.0
#: float input whose peak exceeds this is refused (int16-scaled floats are the usual cause); codecs and
#: resamplers overshoot 1.0 slightly, so the limit is not 1.0
MAX_FLOAT_PEAK = 2.0
#: a 2-D array's channel axis is the one no longer than this
MAX_CHANNELS = 64

_INT_SCALES = {np.dtype(np.int8): 128.0, np.dtype(np.int16): 32768.0, np.dtype(np.int32): 2147483648.0}

AudioSource = str | os.PathLike | bytes | bytearray | memoryview | BinaryIO | np.ndarray | Any


def _max_seconds(max_seconds: float | None) -> float:
    if max_seconds is not None:
        return float(max_seconds)
    env = os.environ.get("OASR_MAX_AUDIO_SECONDS")
    return float(env) if env else DEFAULT_MAX_SECONDS


def describe_source(source: Any) -> str:
    """A short name for ``source`` in error messages."""
    if isinstance(source, (str, os.PathLike)):
        return repr(os.fspath(source))
    if isinstance(source, (bytes, bytearray, memoryview)):
        return f"<{len(source)} bytes>"
    if isinstance(source, np.ndarray):
        return f"<ndarray {source.dtype} {tuple(source.shape)}>"
    if type(source).__module__.startswith("torch"):
        return f"<tensor {getattr(source, 'dtype', '?')} {tuple(getattr(source, 'shape', ()))}>"
    name = getattr(source, "name", None)
    return repr(name) if isinstance(name, str) else f"<{type(source).__name__}>"


def _is_tensor(source: Any) -> bool:
    return type(source).__module__.startswith("torch") and hasattr(source, "detach")


def _mono_from_array(array: np.ndarray, what: str) -> np.ndarray:
    """Integer or float samples, 1-D or 2-D (either axis may be channels) → 1-D float32."""
    if array.dtype in _INT_SCALES:
        array = array.astype(np.float32) / _INT_SCALES[array.dtype]
    elif array.dtype == np.uint8:
        array = (array.astype(np.float32) - 128.0) / 128.0
    elif array.dtype.kind == "f":
        array = array.astype(np.float32, copy=False)
    else:
        raise AudioError(f"audio {what}: unsupported sample dtype {array.dtype}; expected float (in [-1, 1]) "
                         f"or int8/int16/int32/uint8 PCM", source=what)
    if array.ndim == 2 and array.size == 0:
        return np.zeros(0, dtype=np.float32)
    if array.ndim == 2:
        rows, cols = array.shape
        if rows <= MAX_CHANNELS and rows <= cols:
            array = array.mean(axis=0, dtype=np.float32) if rows > 1 else array[0]
        elif cols <= MAX_CHANNELS and cols < rows:
            array = array.mean(axis=1, dtype=np.float32) if cols > 1 else array[:, 0]
        else:
            raise AudioError(f"audio {what}: cannot tell channels from samples in shape {array.shape}; pass "
                             f"(channels, samples) or (samples, channels) with at most {MAX_CHANNELS} channels",
                             source=what)
    elif array.ndim != 1:
        raise AudioError(f"audio {what}: expected 1-D samples or 2-D (channels, samples), got {array.ndim} dimensions "
                         f"{tuple(array.shape)}", source=what)
    return np.ascontiguousarray(array, dtype=np.float32)


def _read_source(source: Any, what: str) -> tuple[Any, int | None]:
    """An encoded source → something soundfile and PyAV can open, and its size in bytes if known."""
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.exists():
            raise AudioError(f"audio file {what} does not exist", source=what)
        if not path.is_file():
            raise AudioError(f"audio source {what} is not a file", source=what)
        return str(path), path.stat().st_size
    if isinstance(source, (bytes, bytearray, memoryview)):
        return io.BytesIO(bytes(source)), len(source)
    if hasattr(source, "read"):
        data = source.read()
        if isinstance(data, str):
            raise AudioError(f"audio {what}: file object is open in text mode; open it with 'rb'", source=what)
        return io.BytesIO(bytes(data)), len(data)
    raise AudioError(f"audio source {what}: unsupported type {type(source).__name__}; expected a path, bytes, "
                     f"a binary file object, a numpy array or a torch tensor", source=what)


def _rewind(handle: Any) -> Any:
    if hasattr(handle, "seek"):
        handle.seek(0)
    return handle


def _decode_soundfile(handle: Any, what: str, limit: float) -> tuple[np.ndarray, int]:
    import soundfile

    with soundfile.SoundFile(_rewind(handle)) as f:
        if f.samplerate > 0 and f.frames > 0 and f.frames / f.samplerate > limit:
            raise AudioError(f"audio {what} is {f.frames / f.samplerate:.0f} s long, over the limit of {limit:.0f} s "
                             f"(max_seconds / OASR_MAX_AUDIO_SECONDS)", source=what)
        data = f.read(dtype="float32", always_2d=True)
        return data.T, f.samplerate


def _decode_av(handle: Any, what: str, limit: float) -> tuple[np.ndarray, int]:
    import av

    with av.open(_rewind(handle), mode="r") as container:
        if not container.streams.audio:
            raise AudioError(f"audio {what}: the container has no audio stream", source=what)
        stream = container.streams.audio[0]
        if stream.duration is not None and stream.time_base is not None:
            seconds = float(stream.duration * stream.time_base)
            if seconds > limit:
                raise AudioError(f"audio {what} is {seconds:.0f} s long, over the limit of {limit:.0f} s "
                                 f"(max_seconds / OASR_MAX_AUDIO_SECONDS)", source=what)
        to_float = av.AudioResampler(format="fltp")
        planes: list[np.ndarray] = []
        rate = stream.codec_context.sample_rate or stream.rate
        decoded = 0
        for frame in container.decode(stream):
            rate = frame.sample_rate or rate
            for converted in to_float.resample(frame):
                planes.append(converted.to_ndarray())
                decoded += planes[-1].shape[1]
            if rate and decoded / rate > limit:
                raise AudioError(f"audio {what} is longer than the limit of {limit:.0f} s "
                                 f"(max_seconds / OASR_MAX_AUDIO_SECONDS)", source=what)
        for converted in to_float.resample(None):
            planes.append(converted.to_ndarray())
    if not planes:
        return np.zeros((1, 0), dtype=np.float32), int(rate or 0)
    return np.concatenate(planes, axis=1), int(rate)


def _decode(source: Any, what: str, limit: float) -> tuple[np.ndarray, int]:
    """Encoded audio → ((channels, samples) float32, sample rate): soundfile first, then FFmpeg."""
    handle, size = _read_source(source, what)
    if size == 0:
        raise AudioError(f"audio {what} is empty (0 bytes)", source=what)
    errors = []
    try:
        return _decode_soundfile(handle, what, limit)
    except AudioError:
        raise
    except Exception as exc:  # libsndfile cannot read this format: try FFmpeg
        errors.append(f"soundfile: {exc}")
    try:
        return _decode_av(handle, what, limit)
    except AudioError:
        raise
    except Exception as exc:
        errors.append(f"ffmpeg: {type(exc).__name__}: {exc}")
    raise AudioError(f"could not decode audio {what} ({'; '.join(errors)})", source=what)


def _check_rate(rate: Any, what: str, name: str) -> int | float:
    if isinstance(rate, bool) or not isinstance(rate, (int, float, np.integer, np.floating)) \
            or not math.isfinite(rate) or rate <= 0:
        raise AudioError(f"audio {what}: {name} must be a positive number, got {rate!r}", source=what)
    return int(rate) if float(rate).is_integer() else float(rate)


def load(source: AudioSource, target_rate: int = 16000, *, sample_rate: int | None = None,
         max_seconds: float | None = None) -> np.ndarray:
    """Decode, downmix and resample ``source`` → 1-D float32 samples in [-1, 1] at ``target_rate``.

    ``sample_rate`` is the rate of a raw array or tensor (default: already ``target_rate``); encoded
    audio carries its own rate and must not be given one.
    """
    what = describe_source(source)
    target_rate = _check_rate(target_rate, what, "target_rate")
    limit = _max_seconds(max_seconds)
    if _is_tensor(source):
        source = source.detach().cpu()
        if source.is_floating_point():
            source = source.float()
        source = source.numpy()
    if isinstance(source, np.ndarray):
        rate = _check_rate(target_rate if sample_rate is None else sample_rate, what, "sample_rate")
        samples = _mono_from_array(source, what)
        if samples.size and np.isfinite(samples).all():
            peak = float(np.abs(samples).max())
            if peak > MAX_FLOAT_PEAK and source.dtype.kind == "f":
                raise AudioError(f"audio {what}: float samples must lie in [-1, 1], got a peak of {peak:g} "
                                 f"(int16-scaled audio? divide by 32768)", source=what)
    else:
        if sample_rate is not None:
            raise AudioError(f"audio {what}: sample_rate applies to raw arrays only; encoded audio carries its "
                             f"own rate", source=what)
        channels, rate = _decode(source, what, limit)
        rate = _check_rate(rate, what, "decoded sample rate")
        samples = _mono_from_array(channels, what)
    if samples.size == 0:
        raise AudioError(f"audio {what} has no samples", source=what)
    if not np.isfinite(samples).all():
        bad = int((~np.isfinite(samples)).sum())
        raise AudioError(f"audio {what} contains {bad} non-finite (NaN or Inf) samples", source=what)
    seconds = samples.size / rate
    if seconds > limit:
        raise AudioError(f"audio {what} is {seconds:.0f} s long, over the limit of {limit:.0f} s "
                         f"(max_seconds / OASR_MAX_AUDIO_SECONDS)", source=what)
    if rate != target_rate:
        import soxr

        samples = soxr.resample(samples, rate, target_rate, quality="HQ").astype(np.float32, copy=False)
    return np.ascontiguousarray(samples)


def duration_seconds(source: AudioSource, *, sample_rate: int | None = None) -> float:
    """Duration of ``source`` in seconds (metadata when the container has it, else a full decode)."""
    what = describe_source(source)
    if _is_tensor(source) or isinstance(source, np.ndarray):
        array = source.detach().cpu().float().numpy() if _is_tensor(source) else source
        if array.ndim == 0 or array.ndim > 2:
            raise AudioError(f"audio {what}: expected 1-D or 2-D samples", source=what)
        rate = _check_rate(16000 if sample_rate is None else sample_rate, what, "sample_rate")
        return (array.shape[-1] if array.ndim == 1 or array.shape[0] <= array.shape[-1] else array.shape[0]) / rate
    handle, size = _read_source(source, what)
    if size == 0:
        raise AudioError(f"audio {what} is empty (0 bytes)", source=what)
    try:
        import soundfile

        info = soundfile.info(_rewind(handle))
        if info.frames > 0 and info.samplerate > 0:
            return info.frames / info.samplerate
    except Exception:  # not a libsndfile format: decode with FFmpeg below
        pass
    channels, rate = _decode(_rewind(handle) if not isinstance(handle, str) else handle, what, math.inf)
    return channels.shape[1] / _check_rate(rate, what, "decoded sample rate")
