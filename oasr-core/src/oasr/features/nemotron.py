"""``nemotron_logmel``: the NeMo log-mel recipe (Nemotron ASR streaming, Nemotron 3.5, Parakeet).

Recipe: pre-emphasis ``y[t] = x[t] - c * x[t-1]`` over the waveform (``y[0] = x[0]``, samples past a row's
length are 0), a centered STFT with constant (zero) padding, n_fft 512 (``config.n_fft``), window length
400 (``frame_length_ms``) — a non-periodic Hann window centered in the FFT frame — hop 160, power
spectrum, slaney mel filters 0 .. Nyquist, ``ln(m + 2**-24)``; no normalization here (Parakeet's
per-feature normalization is ``FeatureConfig.normalize="per_feature"``).  A row of ``L`` samples has
``L // hop`` frames; frames after that are 0.  ``options["mel_filters_dtype"]`` ("float32", "bfloat16",
"float16") rounds the filters and the window to that precision first, as checkpoints that store these
constants in reduced precision do (Nemotron 3.5 Transcribe: bfloat16); the spectrum stays float32.

Streaming: :func:`nemotron_logmel_frames` is the ``center=False`` incremental form.  With the declared
:func:`nemotron_framing` — span n_fft, one sample of pre-emphasis history, ``n_fft // 2 + 1`` zeros of
prefill, ``n_fft // 2 - hop`` zeros appended at the end — it reproduces the offline centered grid frame
for frame, and the offline function is that same computation over a prefilled buffer.
"""

from __future__ import annotations

import functools

import torch

from oasr.errors import ConfigError
from oasr.features.config import FeatureConfig
from oasr.features.mel import slaney_mel_filters
from oasr.features.spec import StreamingFraming
from oasr.features.spectral import interleave_power_weight, mel_groups, stft_mel

N_FFT = 512
LOG_GUARD = 2.0 ** -24
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _geometry(config: FeatureConfig) -> tuple[int, int, int, float]:
    n_fft = config.n_fft or N_FFT
    win, hop = config.frame_length, config.frame_shift
    if win > n_fft:
        raise ConfigError(f"nemotron_logmel: window of {win} samples exceeds n_fft={n_fft}", key="n_fft")
    return n_fft, win, hop, config.effective_preemphasis


def nemotron_framing(config: FeatureConfig) -> StreamingFraming:
    n_fft, _, hop, preemphasis = _geometry(config)
    history = 1 if preemphasis != 0.0 else 0
    return StreamingFraming(span=n_fft, hop=hop, history=history, prefill=n_fft // 2 + history,
                            postfill=max(0, n_fft // 2 - hop))


@functools.lru_cache(maxsize=16)
def _tables(num_mels: int, n_fft: int, win: int, sample_rate: int, dtype_name: str) -> tuple:
    if dtype_name not in _DTYPES:
        raise ConfigError(f"nemotron_logmel: options['mel_filters_dtype'] must be one of {', '.join(_DTYPES)}, "
                          f"got {dtype_name!r}", key="options")
    dtype = _DTYPES[dtype_name]
    hann = torch.hann_window(win, periodic=False).to(dtype).float()
    window = torch.zeros(n_fft)
    left = (n_fft - win) // 2
    window[left:left + win] = hann
    filters = slaney_mel_filters(num_mels, n_fft, sample_rate).to(dtype).float()
    weight = interleave_power_weight(filters)
    return window, weight, mel_groups(weight)


def _preemphasize(segments: torch.Tensor, valid: torch.Tensor, coeff: float) -> torch.Tensor:
    """``y[t] = s[t] - coeff * s[t-1]`` (``y[0] = s[0]``), zero from each row's ``valid`` sample on."""
    if coeff != 0.0:
        shifted = torch.mul(segments[:, :-1], coeff)
        segments = torch.cat([segments[:, :1], torch.sub(segments[:, 1:], shifted)], dim=1)
    beyond = torch.arange(segments.shape[1], device=segments.device)[None, :] >= valid.to(segments.device)[:, None]
    return segments.masked_fill(beyond, 0.0)


def _log_mel(signal: torch.Tensor, counts: list[int], config: FeatureConfig) -> torch.Tensor:
    n_fft, win, hop, _ = _geometry(config)
    window, weight, blocks = _tables(config.num_mel_bins, n_fft, win, config.sample_rate,
                                     str(config.options.get("mel_filters_dtype", "float32")))
    device = signal.device
    out = torch.zeros(signal.shape[0], max(counts, default=0), config.num_mel_bins, device=device)
    if out.shape[1]:
        stft_mel(signal, counts, out, span=n_fft, hop=hop, n_fft=n_fft, window=window.to(device),
                 mel_weight=weight.to(device), mel_blocks=blocks, num_mels=config.num_mel_bins, log="guard",
                 log_eps=LOG_GUARD)
    return out


def nemotron_logmel_frames(segments: torch.Tensor, lengths: torch.Tensor,
                           config: FeatureConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Streaming form: every complete frame of each (B, S) buffer, :func:`nemotron_framing` semantics.

    ``lengths`` are the valid samples per row (history included); later samples are zeros appended at
    the end of a stream, taken as zeros after the pre-emphasis.
    """
    framing = nemotron_framing(config)
    _, _, _, preemphasis = _geometry(config)
    lengths = torch.as_tensor(lengths, dtype=torch.long).reshape(-1).cpu()
    segments = segments.float()
    signal = _preemphasize(segments, lengths, preemphasis)[:, framing.history:]
    frames = framing.frames_in(segments.shape[1])
    counts = [frames] * segments.shape[0]
    return _log_mel(signal, counts, config), torch.tensor(counts, dtype=torch.long)


def batched_nemotron_logmel(padded: torch.Tensor, lengths: torch.Tensor,
                            config: FeatureConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The registered ``nemotron_logmel`` extractor: (B, T) → ((B, T', F), (B,) ``len // hop``)."""
    framing = nemotron_framing(config)
    _, _, hop, preemphasis = _geometry(config)
    lengths = torch.as_tensor(lengths, dtype=torch.long).reshape(-1).cpu()
    counts = lengths // hop
    longest = int(counts.max()) if counts.numel() else 0
    width = max(framing.prefill + padded.shape[1], framing.history + max(longest - 1, 0) * hop + framing.span)
    buffer = torch.zeros(padded.shape[0], width, device=padded.device)
    buffer[:, framing.prefill:framing.prefill + padded.shape[1]] = padded
    signal = _preemphasize(buffer, framing.prefill + lengths, preemphasis)[:, framing.history:]
    return _log_mel(signal, counts.tolist(), config), counts
