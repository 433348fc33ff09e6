"""Voice activity detection: speech spans of audio, offline and streaming.

:class:`SileroVad` scores 512-sample windows of 16 kHz audio with Silero VAD v6 (onnxruntime, the
model file from the ``oasr-core[vad]`` extra); :func:`speech_spans` turns the probabilities into
spans with faster-whisper's :class:`VadOptions` rules; :class:`TurnDetector` finds turns in a stream
(OpenAI's ``server_vad`` rules).
"""

from oasr.vad.options import SpeechSpan, VadOptions
from oasr.vad.silero import SileroStream, SileroVad, VadUnavailableError, default_model_path, default_vad
from oasr.vad.spans import speech_spans


def get_speech_timestamps(audio, options: VadOptions | None = None, sample_rate: int = 16000) -> list[SpeechSpan]:
    """Speech spans ``[start, end)`` (samples) of 16 kHz mono float audio, with the shared Silero VAD."""
    return default_vad().speech_spans(audio, options, sample_rate)


__all__ = ["SileroStream", "SileroVad", "SpeechSpan", "VadOptions", "VadUnavailableError", "default_model_path",
           "default_vad", "get_speech_timestamps", "speech_spans"]
