"""Audio input: any supported source → mono float32 samples in [-1, 1] at the model's rate.

:func:`load` accepts a path (``str`` / ``Path``), encoded bytes, a binary file object, a numpy array or a
torch tensor.  Encoded audio is decoded by soundfile (WAV, FLAC, OGG/Vorbis/Opus, MP3, ...) and, for
whatever libsndfile cannot read, by FFmpeg through PyAV (m4a/AAC, mp4, webm, opus, ...).  Channels are
averaged to mono and the signal is resampled with soxr (``HQ``).  Integer PCM arrays are scaled to
[-1, 1] (int16 / 32768 ...); float arrays must already be in that range.

Encoded audio is decoded as a stream: each decoded block is checked, averaged to mono and fed to a
streaming soxr resampler before the next block is decoded, so memory is bounded by the model-rate mono
signal, whatever the file's channel count and rate.

Limits (all :class:`oasr.errors.AudioError`, checked from the container's metadata before decoding and
enforced again while decoding, since metadata can lie):

- duration: at most ``max_seconds`` (default :data:`DEFAULT_MAX_SECONDS` = 4 h, or the
  ``OASR_MAX_AUDIO_SECONDS`` environment variable);
- decoded size: channels × rate × seconds at most ``max_seconds`` × :data:`DECODED_SAMPLES_PER_SECOND`
  (96,000: the longest accepted 48 kHz stereo file);
- sample rate: at least :data:`MIN_SAMPLE_RATE` (4 kHz); channels: at most :data:`MAX_CHANNELS` (64);
- samples: finite, and float samples (arrays and float files alike) with a peak at most
  :data:`MAX_FLOAT_PEAK` (2.0).

Anything else unusable raises :class:`AudioError` naming the source and the reason too: a missing or
undecodable file, no audio stream, zero samples, an unsupported dtype, more than two dimensions or an
ambiguous channel layout, a non-positive sample rate.
"""

from __future__ import annotations

import contextvars
import io
import math
import os
import threading
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from oasr.errors import AudioError

#: longest audio :func:`load` accepts unless told otherwise (seconds)
DEFAULT_MAX_SECONDS = 4 * 3600.0
#: float input whose peak exceeds this is refused (int16-scaled floats are the usual cause); codecs and
#: resamplers overshoot 1.0 slightly, so the limit is not 1.0
MAX_FLOAT_PEAK = 2.0
#: a 2-D array's channel axis is the one no longer than this; also the most channels a file may carry
MAX_CHANNELS = 64
#: the lowest sample rate accepted (a file labelled 1 Hz would be upsampled into hours of audio)
MIN_SAMPLE_RATE = 4000
#: decoded-size budget: a file may decode to at most this many samples (channels × frames) per second
#: of the duration limit, i.e. as much as the longest accepted 48 kHz stereo file
DECODED_SAMPLES_PER_SECOND = 2 * 48000
#: the settings behind ``max_seconds``, named in the too-long message
LIMIT_HINT = "max_seconds / OASR_MAX_AUDIO_SECONDS"

_INT_SCALES = {np.dtype(np.int8): 128.0, np.dtype(np.int16): 32768.0, np.dtype(np.int32): 2147483648.0}

#: set by a caller whose client may go away (the server's admission): once the event is set, a decode
#: in progress stops at its next block with an AudioError
DECODE_CANCELLED: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar("oasr_decode_cancelled",
                                                                                        default=None)

AudioSource = str | os.PathLike | bytes | bytearray | memoryview | BinaryIO | np.ndarray | Any


def _max_seconds(max_seconds: float | None) -> float:
    if max_seconds is not None:
        return float(max_seconds)
    env = os.environ.get("OASR_MAX_AUDIO_SECONDS")
    if not env:
        return DEFAULT_MAX_SECONDS
    try:
        seconds = float(env)
    except ValueError:
        seconds = math.nan
    if not seconds > 0:
        raise AudioError(f"OASR_MAX_AUDIO_SECONDS must be a positive number of seconds, got {env!r}")
    return seconds


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


def is_samples_with_rate(source: Any) -> bool:
    """``(samples, sample_rate)``: what ``soundfile.read``, ``librosa.load`` and ``torchaudio.load`` return,
    a 2-tuple of an array or tensor and an integer rate (one input, not two)."""
    return (isinstance(source, tuple) and len(source) == 2
            and (isinstance(source[0], np.ndarray) or _is_tensor(source[0]))
            and isinstance(source[1], (int, np.integer)) and not isinstance(source[1], bool))


def is_sample_list(source: Any) -> bool:
    """A list or tuple of plain numbers: samples, not a list of inputs."""
    return (isinstance(source, (list, tuple)) and len(source) > 0
            and all(isinstance(x, (int, float, np.number)) and not isinstance(x, bool) for x in source))


def _unpack_rate(source: Any, sample_rate: int | None) -> tuple[Any, int | None]:
    """``(samples, rate)`` → samples and that rate (a different explicit ``sample_rate`` is an error)."""
    if not is_samples_with_rate(source):
        return source, sample_rate
    samples, rate = source
    if sample_rate is not None and sample_rate != rate:
        raise AudioError(f"audio {describe_source(samples)} comes as (samples, {rate}) but sample_rate={sample_rate} "
                         f"was also given; give one rate", source=describe_source(samples))
    return samples, int(rate)


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


def _too_long(what: str, seconds: float | None, limit: float, hint: str) -> AudioError:
    length = f"is {seconds:.0f} s long, over" if seconds is not None else "is longer than"
    return AudioError(f"audio {what} {length} the limit of {limit:g} s ({hint})", source=what)


class _Decoded:
    """Decoded blocks → mono float32 at the target rate, one block at a time.

    Memory is bounded by the model-rate mono output: each block (any channel count, any rate) is
    checked, averaged to mono and fed to a streaming soxr resampler before the next is decoded.  The
    limits hold while decoding, whatever the container's metadata claimed: output seconds, decoded
    samples (channels × frames, the decode work), finite samples, and the float peak.
    """

    def __init__(self, what: str, target_rate: int | None, limit: float, budget: float, hint: str):
        self.what, self.target_rate, self.limit, self.budget, self.hint = what, target_rate, limit, budget, hint
        self.rate: int | None = None
        self.decoded = 0
        self.frames = 0
        self.seconds = 0.0
        self.chunks: list[np.ndarray] = []
        self._resampler: Any = None

    def _set_rate(self, rate: int) -> None:
        if rate == self.rate:
            return
        check_plausible_rate(rate, self.what)
        self._flush()
        self.rate = rate
        if self.target_rate is not None and rate != self.target_rate:
            import soxr

            self._resampler = soxr.ResampleStream(rate, self.target_rate, 1, dtype="float32", quality="HQ")

    def _emit(self, mono: np.ndarray) -> None:
        if mono.size:
            self.chunks.append(np.ascontiguousarray(mono, dtype=np.float32))

    def _flush(self) -> None:
        if self._resampler is not None:
            self._emit(self._resampler.resample_chunk(np.zeros(0, dtype=np.float32), last=True))
            self._resampler = None

    def add(self, block: np.ndarray, rate: int) -> None:
        """One decoded block, (channels, frames) float32 at ``rate``."""
        cancelled = DECODE_CANCELLED.get()
        if cancelled is not None and cancelled.is_set():
            raise AudioError(f"audio {self.what}: decoding stopped, the request was abandoned", source=self.what)
        self._set_rate(int(rate))
        channels, frames = block.shape
        self.decoded += block.size
        self.frames += frames
        self.seconds += frames / self.rate
        if self.seconds > self.limit:
            raise _too_long(self.what, None, self.limit, self.hint)
        if self.decoded > self.budget:
            raise AudioError(f"audio {self.what} decodes to more than {self.budget:.3g} samples (channels × rate × "
                             f"seconds), over the decoded-size budget for a {self.limit:g} s limit "
                             f"({DECODED_SAMPLES_PER_SECOND} per second of the limit)", source=self.what)
        if not np.isfinite(block).all():
            bad = int((~np.isfinite(block)).sum())
            raise AudioError(f"audio {self.what} contains non-finite (NaN or Inf) samples ({bad} in one block)",
                             source=self.what)
        peak = float(np.abs(block).max()) if block.size else 0.0
        if peak > MAX_FLOAT_PEAK:
            raise AudioError(f"audio {self.what}: float samples must lie in [-1, 1], got a peak of {peak:g} "
                             f"(a float file scaled like int16? divide by 32768)", source=self.what)
        if self.target_rate is None:
            return  # counting only
        mono = block.mean(axis=0, dtype=np.float32) if channels > 1 else block[0]
        self._emit(self._resampler.resample_chunk(mono) if self._resampler is not None else mono)

    def finish(self) -> np.ndarray:
        self._flush()
        if not self.chunks:
            return np.zeros(0, dtype=np.float32)
        return self.chunks[0] if len(self.chunks) == 1 else np.concatenate(self.chunks)


def _precheck(what: str, channels: int, rate: float, seconds: float | None, limit: float, budget: float,
              hint: str) -> None:
    """Refuse from the container's metadata, before decoding a sample."""
    if rate:
        check_plausible_rate(rate, what)
    if channels > MAX_CHANNELS:
        raise AudioError(f"audio {what} has {channels} channels; at most {MAX_CHANNELS} are accepted", source=what)
    if seconds is not None and seconds > limit:
        raise _too_long(what, seconds, limit, hint)
    if seconds is not None and rate and channels * rate * seconds > budget:
        raise AudioError(f"audio {what} would decode to {channels * rate * seconds:.3g} samples ({channels} channels × "
                         f"{rate:g} Hz × {seconds:.0f} s), over the decoded-size budget of {budget:.3g} for a "
                         f"{limit:g} s limit ({DECODED_SAMPLES_PER_SECOND} per second of the limit)", source=what)


def _decode_soundfile(handle: Any, sink: _Decoded) -> None:
    import soundfile

    with soundfile.SoundFile(_rewind(handle)) as f:
        seconds = f.frames / f.samplerate if f.samplerate > 0 and 0 < f.frames < 2**62 else None
        _precheck(sink.what, f.channels, f.samplerate, seconds, sink.limit, sink.budget, sink.hint)
        blocksize = max(4096, min(int(f.samplerate), 1 << 18))
        for block in f.blocks(blocksize=blocksize, dtype="float32", always_2d=True):
            sink.add(block.T, f.samplerate)


def _decode_av(handle: Any, sink: _Decoded) -> None:
    import av

    with av.open(_rewind(handle), mode="r") as container:
        if not container.streams.audio:
            raise AudioError(f"audio {sink.what}: the container has no audio stream", source=sink.what)
        stream = container.streams.audio[0]
        rate = stream.codec_context.sample_rate or stream.rate or 0
        seconds = None
        if stream.duration is not None and stream.time_base is not None:
            seconds = float(stream.duration * stream.time_base)
        _precheck(sink.what, stream.codec_context.channels or 0, rate, seconds, sink.limit, sink.budget, sink.hint)
        to_float = av.AudioResampler(format="fltp")
        for frame in container.decode(stream):
            for converted in to_float.resample(frame):
                sink.add(converted.to_ndarray(), converted.sample_rate or rate)
        for converted in to_float.resample(None):
            sink.add(converted.to_ndarray(), converted.sample_rate or rate)
        if sink.rate is None and rate:
            sink._set_rate(int(rate))


def _decode(source: Any, what: str, sink: _Decoded) -> _Decoded:
    """Encoded audio through ``sink``: soundfile first, then FFmpeg (PyAV)."""
    handle, size = _read_source(source, what)
    if size == 0:
        raise AudioError(f"audio {what} is empty (0 bytes)", source=what)
    errors = []
    for name, decoder in (("soundfile", _decode_soundfile), ("ffmpeg", _decode_av)):
        try:
            decoder(handle, sink)
            return sink
        except AudioError:
            raise
        except Exception as exc:  # this decoder cannot read the format: try the next one
            if sink.decoded:
                raise AudioError(f"audio {what} failed while decoding ({name}: {type(exc).__name__}: {exc})",
                                 source=what) from None
            message = _library_message(exc, handle)
            errors.append(f"{name}: {type(exc).__name__}: {message}" if name == "ffmpeg" else f"{name}: {message}")
    raise AudioError(f"could not decode audio {what} ({'; '.join(errors)})", source=what)


def _library_message(exc: Exception, handle: Any) -> str:
    """A decoder's error text without the in-memory buffer's repr (``<_io.BytesIO object at 0x…>``, shown
    as "the input") or PyAV's placeholder name for an unnamed input (``: '<none>'``)."""
    text = str(exc)
    if not isinstance(handle, str):
        text = text.replace(repr(handle), "the input")
    return text.replace(": '<none>'", "")


def check_plausible_rate(rate: float, what: str) -> None:
    """Refuse a sample rate below :data:`MIN_SAMPLE_RATE` (a mislabelled file would be upsampled into hours)."""
    if rate < MIN_SAMPLE_RATE:
        raise AudioError(f"audio {what}: sample rate {rate:g} Hz is below the minimum of {MIN_SAMPLE_RATE} Hz; "
                         f"no speech recording is sampled that slowly (a mislabelled header?)", source=what)


def _check_rate(rate: Any, what: str, name: str) -> int | float:
    if isinstance(rate, bool) or not isinstance(rate, (int, float, np.integer, np.floating)) \
            or not math.isfinite(rate) or rate <= 0:
        raise AudioError(f"audio {what}: {name} must be a positive number, got {rate!r}", source=what)
    return int(rate) if float(rate).is_integer() else float(rate)


def load(source: AudioSource, target_rate: int = 16000, *, sample_rate: int | None = None,
         max_seconds: float | None = None, limit_hint: str = LIMIT_HINT) -> np.ndarray:
    """Decode, downmix and resample ``source`` → 1-D float32 samples in [-1, 1] at ``target_rate``.

    ``sample_rate`` is the rate of a raw array or tensor (default: already ``target_rate``), or comes with
    it as ``(samples, rate)`` (what ``soundfile.read`` / ``torchaudio.load`` return); encoded audio carries
    its own rate and must not be given one.  ``limit_hint`` names the setting behind ``max_seconds`` in
    the too-long message.
    """
    source, sample_rate = _unpack_rate(source, sample_rate)
    what = describe_source(source)
    if is_sample_list(source):
        raise AudioError(f"audio: got a {type(source).__name__} of {len(source)} numbers; pass samples as a numpy "
                         f"array (np.asarray(samples, dtype=np.float32)) with their sample_rate", source=what)
    target_rate = _check_rate(target_rate, what, "target_rate")
    limit = _max_seconds(max_seconds)
    if _is_tensor(source):
        source = source.detach().cpu()
        if source.is_floating_point():
            source = source.float()
        source = source.numpy()
    if isinstance(source, np.ndarray):
        rate = _check_rate(target_rate if sample_rate is None else sample_rate, what, "sample_rate")
        check_plausible_rate(rate, what)
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
        sink = _decode(source, what, _Decoded(what, target_rate, limit, limit * DECODED_SAMPLES_PER_SECOND,
                                              limit_hint))
        samples = sink.finish()
        if samples.size == 0:
            raise AudioError(f"audio {what} has no samples", source=what)
        return samples
    if samples.size == 0:
        raise AudioError(f"audio {what} has no samples", source=what)
    if not np.isfinite(samples).all():
        bad = int((~np.isfinite(samples)).sum())
        raise AudioError(f"audio {what} contains {bad} non-finite (NaN or Inf) samples", source=what)
    seconds = samples.size / rate
    if seconds > limit:
        raise _too_long(what, seconds, limit, limit_hint)
    if rate != target_rate:
        import soxr

        samples = soxr.resample(samples, rate, target_rate, quality="HQ").astype(np.float32, copy=False)
    return np.ascontiguousarray(samples)


def stream_chunk(samples: Any, what: str = "stream chunk") -> np.ndarray:
    """One piece of a live stream → 1-D float32 samples in [-1, 1], with the same rules as :func:`load`
    for raw arrays (int PCM scaled, channels on either axis averaged, finite, floats within range).

    ``bytes`` are PCM16 little-endian mono.  An empty chunk is allowed (a stream may end with one);
    rate conversion is the stream's business (it keeps the resampler state between chunks).
    """
    if _is_tensor(samples):
        samples = samples.detach().cpu()
        samples = (samples.float() if samples.is_floating_point() else samples).numpy()
    if isinstance(samples, (bytes, bytearray, memoryview)):
        raw = bytes(samples)
        if len(raw) % 2:
            raise AudioError(f"audio {what}: PCM16 bytes must hold whole 16-bit samples, got {len(raw)} bytes",
                             source=what)
        samples = np.frombuffer(raw, dtype="<i2")
    array = np.asarray(samples)
    data = _mono_from_array(array, what)
    if not np.isfinite(data).all():
        bad = int((~np.isfinite(data)).sum())
        raise AudioError(f"audio {what} contains {bad} non-finite (NaN or Inf) samples", source=what)
    if data.size and array.dtype.kind == "f" and float(np.abs(data).max()) > MAX_FLOAT_PEAK:
        raise AudioError(f"audio {what}: float samples must lie in [-1, 1], got a peak of "
                         f"{float(np.abs(data).max()):g} (int16-scaled audio? divide by 32768)", source=what)
    return data


def duration_seconds(source: AudioSource, *, sample_rate: int | None = None) -> float:
    """Duration of ``source`` in seconds (metadata when the container has it, else a counting decode)."""
    source, sample_rate = _unpack_rate(source, sample_rate)
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
    sink = _decode(_rewind(handle) if not isinstance(handle, str) else handle, what,
                   _Decoded(what, None, math.inf, math.inf, LIMIT_HINT))
    return sink.seconds
