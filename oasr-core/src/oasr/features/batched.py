"""The engine's entry into the Kaldi frontend: ``kaldi_fbank`` and ``kaldi_mfcc``.

Both delegate to the modules :class:`oasr.features.spectral.Fbank` / :class:`~oasr.features.spectral.Mfcc`,
built once per (config, device) — a served request and ``Fbank`` are the same code and give
bit-identical output.  Every Kaldi option runs on the batched path (all five windows, ``snip_edges``
either way, ``dither``, ``use_energy``).

Streaming: ``snip_edges=True`` framing is its own streaming grid (frames restart at buffer position 0,
no history, no prefill); ``snip_edges=False`` reflects the signal at both ends, which the streaming
extractor reproduces by writing the mirrored samples into the buffer (``StreamingFraming.mirror``)
and framing it with the ``snip_edges=True`` variant (:func:`buffer_fbank` / :func:`buffer_mfcc`).
"""

from __future__ import annotations

import threading

import attrs
import torch

from oasr.features.config import FeatureConfig
from oasr.features.spec import StreamingFraming
from oasr.features.spectral import Fbank, Mfcc

_modules: dict[tuple, Fbank] = {}
_lock = threading.Lock()


def _kaldi_kwargs(config: FeatureConfig) -> dict:
    options = config.options
    return dict(
        sample_rate=config.sample_rate, num_mel_bins=config.num_mel_bins, frame_length_ms=config.frame_length_ms,
        frame_shift_ms=config.frame_shift_ms, n_fft=config.n_fft, window_type=config.window_type,
        blackman_coeff=float(options.get("blackman_coeff", 0.42)), preemphasis=config.effective_preemphasis,
        remove_dc_offset=bool(options.get("remove_dc_offset", True)), dither=config.dither,
        snip_edges=config.snip_edges, low_freq=config.low_freq, high_freq=config.high_freq,
        use_energy=config.use_energy, raw_energy=bool(options.get("raw_energy", True)),
        energy_floor=config.energy_floor,
    )


def build_kaldi_module(config: FeatureConfig) -> Fbank:
    """A fresh :class:`Fbank` (``kaldi_fbank``) or :class:`Mfcc` (``kaldi_mfcc``) for ``config``."""
    kwargs = _kaldi_kwargs(config)
    if config.feature_type == "kaldi_mfcc":
        return Mfcc(num_ceps=config.num_ceps, cepstral_lifter=config.cepstral_lifter, **kwargs)
    return Fbank(**kwargs)


def kaldi_module(config: FeatureConfig, device: torch.device | str = "cpu") -> Fbank:
    """The cached module that serves ``config`` on ``device``."""
    key = (config.feature_type, config.cache_key(), str(torch.device(device)))
    module = _modules.get(key)
    if module is None:
        with _lock:
            module = _modules.get(key)
            if module is None:
                module = build_kaldi_module(config).to(device)
                _modules[key] = module
    return module


def batched_fbank(padded: torch.Tensor, lengths: torch.Tensor, config: FeatureConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) samples at the model's audio scale → Kaldi log mel filterbank (B, T', F), frame counts (B,)."""
    return kaldi_module(config, padded.device)(padded, lengths)


def batched_mfcc(padded: torch.Tensor, lengths: torch.Tensor, config: FeatureConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) samples at the model's audio scale → Kaldi MFCC (B, T', num_ceps), frame counts (B,)."""
    return kaldi_module(config, padded.device)(padded, lengths)


def buffer_fbank(padded: torch.Tensor, lengths: torch.Tensor, config: FeatureConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`batched_fbank` framing the buffer as given (``snip_edges=True``): the streaming variant,
    whose buffer already holds a ``snip_edges=False`` stream's mirrored samples."""
    return batched_fbank(padded, lengths, attrs.evolve(config, snip_edges=True))


def buffer_mfcc(padded: torch.Tensor, lengths: torch.Tensor, config: FeatureConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`batched_mfcc` framing the buffer as given (see :func:`buffer_fbank`)."""
    return batched_mfcc(padded, lengths, attrs.evolve(config, snip_edges=True))


def kaldi_framing(config: FeatureConfig) -> StreamingFraming:
    """``snip_edges`` framing streams as is; reflected edges stream with the mirrored samples in the buffer."""
    if not config.snip_edges:
        return StreamingFraming(span=config.frame_length, hop=config.frame_shift,
                                mirror=config.frame_length // 2 - config.frame_shift // 2)
    return StreamingFraming(span=config.frame_length, hop=config.frame_shift)


def fbank_dim(config: FeatureConfig) -> int:
    return config.num_mel_bins + int(config.use_energy)


def mfcc_dim(config: FeatureConfig) -> int:
    return config.num_ceps
