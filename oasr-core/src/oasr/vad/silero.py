"""Silero VAD v6 run with onnxruntime.

The model file is the ``silero_vad_v6.onnx`` that the faster-whisper wheel ships (installed by the
``oasr-core[vad]`` extra; nothing is downloaded at run time).  That export reads a sequence of
576-sample rows — the last 64 samples of the previous 512-sample window followed by the window —
and carries its LSTM state ``(h, c)`` from row to row, so the whole audio runs in one call and a
stream runs window by window with the same result.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import numpy as np

from oasr.errors import OasrError
from oasr.vad.options import SpeechSpan, VadOptions
from oasr.vad.spans import WINDOW, speech_spans

CONTEXT = 64
SAMPLE_RATE = 16000
MODEL_FILE = "silero_vad_v6.onnx"
#: rows per onnxruntime call: bounds the model's working memory (about 17 kB a row) on long audio
ROWS_PER_CALL = 1024


class VadUnavailableError(OasrError, ImportError):
    """The VAD runtime (onnxruntime) or its model file is not installed."""


def default_model_path() -> Path:
    """The Silero VAD file shipped in the faster-whisper wheel (located without importing the package)."""
    spec = importlib.util.find_spec("faster_whisper")
    if spec is None or not spec.submodule_search_locations:
        raise VadUnavailableError(
            f"the VAD model file {MODEL_FILE} ships in the faster-whisper package, which is not installed; "
            f"install the VAD extra: pip install 'oasr-core[vad]'")
    path = Path(next(iter(spec.submodule_search_locations))) / "assets" / MODEL_FILE
    if not path.is_file():
        raise VadUnavailableError(f"the VAD model file is missing: expected {path} (reinstall faster-whisper)")
    return path


class SileroVad:
    """Per-window speech probabilities of 16 kHz audio; speech spans with :class:`VadOptions` rules."""

    sample_rate = SAMPLE_RATE
    window = WINDOW

    def __init__(self, model_path: str | Path | None = None):
        try:
            import onnxruntime
        except ImportError as exc:
            raise VadUnavailableError("the VAD needs onnxruntime; install the VAD extra: "
                                      "pip install 'oasr-core[vad]'") from exc
        path = Path(model_path) if model_path is not None else default_model_path()
        options = onnxruntime.SessionOptions()
        options.inter_op_num_threads = 1
        options.intra_op_num_threads = 1
        options.enable_cpu_mem_arena = False
        options.log_severity_level = 4
        self.model_path = path
        self.session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"],
                                                    sess_options=options)

    @staticmethod
    def initial_state() -> tuple[np.ndarray, np.ndarray]:
        return np.zeros((1, 1, 128), np.float32), np.zeros((1, 1, 128), np.float32)

    def run_rows(self, rows: np.ndarray, state: tuple[np.ndarray, np.ndarray]):
        """Probabilities of (N, 576) rows in order, and the state after the last row."""
        h, c = state
        out = []
        for i in range(0, rows.shape[0], ROWS_PER_CALL):
            probs, h, c = self.session.run(None, {"input": rows[i:i + ROWS_PER_CALL], "h": h, "c": c})
            out.append(np.asarray(probs, np.float32).reshape(-1))
        return (np.concatenate(out) if out else np.zeros(0, np.float32)), (h, c)

    @staticmethod
    def rows(windows: np.ndarray, context: np.ndarray) -> np.ndarray:
        """(N, 512) windows as model rows: each prefixed by the 64 samples before it."""
        before = np.concatenate([context[None], windows[:-1, -CONTEXT:]]) if len(windows) else context[None, :0]
        return np.ascontiguousarray(np.concatenate([before, windows], axis=1), dtype=np.float32)

    def probabilities(self, audio: np.ndarray) -> np.ndarray:
        """One speech probability per 512-sample window.

        As faster-whisper scores audio: the last window is zero-padded (a whole extra window when the
        length is a multiple of 512) and its final 64 samples are zeroed.  The audio is read in blocks
        of ``ROWS_PER_CALL`` windows, so memory beyond the audio itself stays bounded.
        """
        audio = np.asarray(audio, dtype=np.float32).reshape(-1)
        full = audio.shape[0] // WINDOW
        last = np.zeros((1, WINDOW), np.float32)
        last[0, : audio.shape[0] - full * WINDOW] = audio[full * WINDOW:]
        last[0, -CONTEXT:] = 0.0
        whole = audio[: full * WINDOW].reshape(full, WINDOW)
        state, context = self.initial_state(), np.zeros(CONTEXT, np.float32)
        out = []
        for i in range(0, full + 1, ROWS_PER_CALL):
            windows = whole[i:i + ROWS_PER_CALL]
            if i + ROWS_PER_CALL > full:
                windows = np.concatenate([windows, last])
            probs, state = self.run_rows(self.rows(windows, context), state)
            context = windows[-1, -CONTEXT:].copy()
            out.append(probs)
        return np.concatenate(out)

    def speech_spans(self, audio: np.ndarray, options: VadOptions | None = None,
                     sample_rate: int = SAMPLE_RATE) -> list[SpeechSpan]:
        """Speech spans ``[start, end)`` in samples of 16 kHz mono audio."""
        check_rate(sample_rate)
        audio = np.asarray(audio, dtype=np.float32).reshape(-1)
        return speech_spans(self.probabilities(audio), audio.shape[0], options, sample_rate)

    def stream(self) -> SileroStream:
        return SileroStream(self)


class SileroStream:
    """Incremental probabilities: push samples, get one probability per completed 512-sample window."""

    def __init__(self, vad: SileroVad):
        self.vad = vad
        self.reset()

    def reset(self) -> None:
        self.state = self.vad.initial_state()
        self.context = np.zeros(CONTEXT, np.float32)
        self.pending = np.zeros(0, np.float32)
        #: windows scored so far (window i covers samples [512 i, 512 (i + 1)))
        self.windows = 0

    def push(self, samples: np.ndarray) -> np.ndarray:
        data = np.concatenate([self.pending, np.asarray(samples, np.float32).reshape(-1)])
        n = data.shape[0] // WINDOW
        self.pending = data[n * WINDOW:]
        if n == 0:
            return np.zeros(0, np.float32)
        windows = data[: n * WINDOW].reshape(n, WINDOW)
        probs, self.state = self.vad.run_rows(self.vad.rows(windows, self.context), self.state)
        self.context = windows[-1, -CONTEXT:].copy()
        self.windows += n
        return probs


def check_rate(sample_rate: int) -> None:
    if sample_rate != SAMPLE_RATE:
        raise OasrError(f"the Silero VAD reads {SAMPLE_RATE} Hz audio, got {sample_rate} Hz; resample first")


@functools.lru_cache(maxsize=1)
def default_vad() -> SileroVad:
    """One shared Silero VAD (its session runs one thread; calls are serialized by onnxruntime)."""
    return SileroVad()
