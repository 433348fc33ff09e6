"""``whisper_logmel``: the Whisper log-mel recipe, batched.

Recipe: centered STFT (reflect padding), n_fft 400 (``config.n_fft``), hop 160 (``frame_shift_ms``), periodic
Hann window, power spectrum, slaney mel filters 0 .. Nyquist (``num_mel_bins``: 80 or 128), the last STFT
frame dropped, ``log10(max(m, 1e-10))``, then per row ``max(x, max(x) - 8)`` and ``(x + 4) / 4``.
``audio_scale`` 1.0.

``config.window_seconds`` switches the fixed window:

- set (Whisper checkpoints: 30.0): every row is zero-padded or trimmed to the window, as transformers'
  ``WhisperFeatureExtractor`` and openai-whisper's ``log_mel_spectrogram(pad_or_trim(audio))`` do; all rows
  have ``window // hop`` frames, the max-norm runs over all of them, and ``feat_lengths`` are the real
  per-row counts ``ceil(len / hop)`` (transformers' attention-mask semantics; Whisper ignores them, a
  Qwen2-Audio tower masks by them).
- None: each row's own audio, ``len // hop`` frames, max-norm over those frames, zeros after them.

:func:`log_mel` is openai-whisper's ``log_mel_spectrogram(audio, n_mels, padding)`` (long-form decoding
takes the log-mel of the whole audio followed by 30 s of zeros and slices windows from it).

The recipe has a fixed window and a global max-norm, so it does not stream.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from oasr.features.config import FeatureConfig
from oasr.features.mel import slaney_mel_filters
from oasr.features.spectral import TILE_FRAMES, interleave_power_weight, mel_groups, reflect_rows, stft_mel

N_FFT = 400
HOP_LENGTH = 160
SAMPLE_RATE = 16000
LOG_FLOOR = 1e-10
#: frames whose reflected source is made at once on the CPU (about 5 MB of samples per row)
SOURCE_BLOCK_FRAMES = 8 * TILE_FRAMES


@functools.lru_cache(maxsize=16)
def _tables(num_mels: int, n_fft: int, sample_rate: int) -> tuple[torch.Tensor, torch.Tensor, tuple]:
    weight = interleave_power_weight(slaney_mel_filters(num_mels, n_fft, sample_rate))
    return torch.hann_window(n_fft), weight, mel_groups(weight)


def whisper_logmel(padded: torch.Tensor, lengths: torch.Tensor, *, num_mels: int = 80, n_fft: int = N_FFT,
                   hop: int = HOP_LENGTH, sample_rate: int = SAMPLE_RATE, window_samples: int | None = None,
                   padding_samples: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) samples, (B,) lengths → ((B, T', num_mels) normalized log-mel, (B,) frame counts).

    ``window_samples``: pad/trim every row to this many samples first (see the module docstring).
    ``padding_samples``: zeros appended to every row before the STFT (openai-whisper's ``padding``;
    without a window only), read as zeros, never copied in.
    """
    if padding_samples and window_samples is not None:
        raise ValueError("padding_samples applies to rows without a fixed window; got both")
    lengths = torch.as_tensor(lengths, dtype=torch.long).reshape(-1).cpu()
    padded = padded.float()
    device = padded.device
    window, weight, blocks = _tables(num_mels, n_fft, sample_rate)
    window, weight = window.to(device), weight.to(device)
    if window_samples is not None:
        rows = padded[:, :window_samples]
        keep = torch.arange(rows.shape[1])[None, :] < lengths.clamp(max=window_samples)[:, None]
        signal = torch.zeros(padded.shape[0], window_samples, device=device)
        signal[:, :rows.shape[1]] = rows * keep.to(device)
        signal_lengths = torch.full_like(lengths, window_samples)
        counts = signal_lengths // hop
        feat_lengths = torch.minimum(-(-lengths // hop), counts)
    else:
        signal, signal_lengths = padded, lengths + padding_samples
        counts = signal_lengths // hop
        feat_lengths = counts
    count_list = counts.tolist()
    longest = max(count_list, default=0)
    out = torch.zeros(padded.shape[0], longest, num_mels, device=device)
    if longest == 0:
        return out, feat_lengths
    zeros_from = lengths.to(device) if padding_samples else None
    # on the CPU the reflected source is made a block of frames at a time, so a long recording is never
    # copied whole (a frame's features do not depend on the frames computed with it: the blocks join
    # exactly); a device kernel writes a contiguous output, in one call
    step = SOURCE_BLOCK_FRAMES if device.type == "cpu" else longest
    for f0 in range(0, longest, step):
        part = [min(max(c - f0, 0), step) for c in count_list]
        source = reflect_rows(signal, signal_lengths.to(device), n_fft // 2 - f0 * hop,
                              (max(part) - 1) * hop + n_fft, repeat_edge=False, zeros_from=zeros_from)
        stft_mel(source, part, out[:, f0:f0 + step], span=n_fft, hop=hop, n_fft=n_fft, window=window,
                 mel_weight=weight, mel_blocks=blocks, num_mels=num_mels, log="log10", log_eps=LOG_FLOOR)
    # normalized per row in place (a long recording's log-mel is not copied): max(x, row max - 8), then
    # (x + 4) / 4 over the row's frames; frames past them stay 0
    for row, count in enumerate(count_list):
        if count:
            frames = out[row, :count]
            frames.clamp_(min=float(frames.amax()) - 8.0).add_(4.0).div_(4.0)
    return out, feat_lengths


def batched_whisper_logmel(padded: torch.Tensor, lengths: torch.Tensor,
                           config: FeatureConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The registered ``whisper_logmel`` extractor."""
    window = config.window_seconds
    return whisper_logmel(
        padded, lengths, num_mels=config.num_mel_bins, n_fft=config.n_fft or N_FFT, hop=config.frame_shift,
        sample_rate=config.sample_rate,
        window_samples=None if window is None else round(window * config.sample_rate),
    )


def log_mel(audio: np.ndarray | torch.Tensor, n_mels: int = 80, padding_samples: int = 0) -> torch.Tensor:
    """openai-whisper's ``log_mel_spectrogram(audio, n_mels, padding)``: (n_mels, (len + padding) // 160).

    ``audio`` is 1-D float at 16 kHz; ``padding_samples`` zeros are appended before the STFT and the
    max-norm covers them too.
    """
    audio = torch.as_tensor(audio, dtype=torch.float32).reshape(-1)
    feats, _ = whisper_logmel(audio[None], torch.tensor([audio.numel()]), num_mels=n_mels,
                              padding_samples=max(0, padding_samples))
    return feats[0].t()
