"""Core's built-in frontends, as :class:`ExtractorSpec` values with lazily imported functions.

``oasr._builtins`` registers these through the ``oasr_register_extractors`` hook, the same path a
plugin's frontends take.  Importing this module imports no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from oasr.errors import ConfigError
from oasr.features.spec import ExtractorSpec

if TYPE_CHECKING:
    from oasr.features.config import FeatureConfig

KALDI_OPTION_KEYS = ("raw_energy", "remove_dc_offset", "blackman_coeff")
KALDI_WINDOW_TYPES = ("povey", "hanning", "hamming", "blackman", "rectangular")
NEMOTRON_OPTION_KEYS = ("mel_filters_dtype",)
MEL_FILTER_DTYPES = ("float32", "bfloat16", "float16")


def validate_kaldi(config: FeatureConfig) -> None:
    """The Kaldi options' own constraints (mel range against Nyquist, window, DCT size, FFT size)."""
    if config.window_type not in KALDI_WINDOW_TYPES:
        raise ConfigError(f"window_type {config.window_type!r} is not a Kaldi window; expected one of "
                          f"{', '.join(KALDI_WINDOW_TYPES)}", key="window_type")
    if config.num_mel_bins < 3:
        raise ConfigError(f"num_mel_bins must be at least 3, got {config.num_mel_bins}", key="num_mel_bins")
    nyquist = config.sample_rate / 2
    high = config.high_freq + nyquist if config.high_freq <= 0 else config.high_freq
    if not (0.0 <= config.low_freq < nyquist and 0.0 < high <= nyquist and config.low_freq < high):
        raise ConfigError(f"mel range low_freq={config.low_freq} .. high_freq={config.high_freq} Hz must satisfy "
                          f"0 <= low < high <= Nyquist ({nyquist} Hz); a high_freq <= 0 is an offset from Nyquist",
                          key="high_freq")
    if config.n_fft is not None and config.n_fft < config.frame_length:
        raise ConfigError(f"n_fft={config.n_fft} is shorter than the window ({config.frame_length} samples)",
                          key="n_fft")
    if config.energy_floor < 0:
        raise ConfigError(f"energy_floor must be >= 0, got {config.energy_floor}", key="energy_floor")
    if config.feature_type == "kaldi_mfcc" and not 0 < config.num_ceps <= config.num_mel_bins:
        raise ConfigError(f"num_ceps must be in [1, num_mel_bins={config.num_mel_bins}], got {config.num_ceps}",
                          key="num_ceps")


def validate_nemotron(config: FeatureConfig) -> None:
    n_fft = config.n_fft or 512
    if config.frame_length > n_fft:
        raise ConfigError(f"nemotron_logmel: window of {config.frame_length} samples exceeds n_fft={n_fft}",
                          key="n_fft")
    dtype = config.options.get("mel_filters_dtype", "float32")
    if dtype not in MEL_FILTER_DTYPES:
        raise ConfigError(f"nemotron_logmel: options['mel_filters_dtype'] must be one of "
                          f"{', '.join(MEL_FILTER_DTYPES)}, got {dtype!r}", key="options")


def builtin_extractors() -> list[ExtractorSpec]:
    """The frontends oasr-core ships."""
    return [
        ExtractorSpec(
            kind="kaldi_fbank",
            fn="oasr.features.batched:batched_fbank",
            framing="oasr.features.batched:kaldi_framing",
            streaming_fn="oasr.features.batched:buffer_fbank",
            feature_dim="oasr.features.batched:fbank_dim",
            option_keys=KALDI_OPTION_KEYS,
            validate=validate_kaldi,
            description="Kaldi compute-fbank-feats (torchaudio.compliance.kaldi.fbank)",
        ),
        ExtractorSpec(
            kind="kaldi_mfcc",
            fn="oasr.features.batched:batched_mfcc",
            framing="oasr.features.batched:kaldi_framing",
            streaming_fn="oasr.features.batched:buffer_mfcc",
            feature_dim="oasr.features.batched:mfcc_dim",
            option_keys=KALDI_OPTION_KEYS,
            validate=validate_kaldi,
            description="Kaldi compute-mfcc-feats (torchaudio.compliance.kaldi.mfcc)",
        ),
        ExtractorSpec(
            kind="whisper_logmel",
            fn="oasr.features.whisper:batched_whisper_logmel",
            window_seconds_attr="window_seconds",
            description="Whisper log-mel: n_fft 400, hop 160, slaney mels, log10, max-norm; optional fixed window",
        ),
        ExtractorSpec(
            kind="nemotron_logmel",
            fn="oasr.features.nemotron:batched_nemotron_logmel",
            framing="oasr.features.nemotron:nemotron_framing",
            streaming_fn="oasr.features.nemotron:nemotron_logmel_frames",
            option_keys=NEMOTRON_OPTION_KEYS,
            validate=validate_nemotron,
            description="NeMo log-mel: pre-emphasis, n_fft 512 / win 400 centered STFT, slaney mels, ln(m + 2^-24)",
        ),
    ]
