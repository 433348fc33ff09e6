"""Spectral features: the Kaldi filterbank and MFCC modules, and the tiled STFT → mel core every
built-in frontend runs on.

Contract:

- ``Fbank(...)(waveforms (B, T), lengths (B,)) -> (features (B, T', F) float32, frame counts (B,))``
  equals ``torchaudio.compliance.kaldi.fbank`` applied to each row to float32 rounding; ``Mfcc``
  likewise for ``kaldi.mfcc``.  Waveforms arrive already at the model's audio scale (WeNet and FunASR
  multiply [-1, 1] samples by 32768 before this; icefall does not).  Frames past a row's count are 0.
- :func:`stft_mel` is the shared core: frames read from a padded waveform, optional per-frame DC
  removal and pre-emphasis, a window, one real FFT, the power spectrum projected on a mel matrix with
  a single GEMM, and a log.  ``oasr.features`` builds the Whisper and NeMo recipes on it.

How it is computed: a frame is read straight from the padded waveform through a strided view (no
unfold copy of the signal).  Frames are processed in tiles of :data:`TILE_FRAMES`, small enough that
the FFT buffer, spectrum and mel energies of a tile stay in the L2 cache.  The squared real and
imaginary parts are multiplied by a mel matrix whose rows are duplicated per component, so the power
spectrum is never formed by a strided reduction.

Determinism: a frame's features do not depend on which tile it falls in or how many frames are
computed with it, so chunked streaming reproduces offline features bit for bit.  Two rules make that
so: the GEMMs and the log run on a row count rounded up to a multiple of :data:`_ROW_ALIGN` (MKL's
small-M GEMM path and the scalar tail of a vectorized ``log`` round differently), and every GEMM
writes whole blocks of :data:`GEMM_COLUMNS` output columns (a narrow output makes MKL's result for a
row depend on the row's position).

The Kaldi mel-energy floor is ``FLT_EPSILON`` (Kaldi's ``ApplyFloor(numeric_limits<float>::epsilon())``,
which torchaudio reproduces), not float32 ``tiny``: a floored bin reads -15.94, and with an audio
scale of 1.0 real speech frames do reach it.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator

import torch
from torch import nn

from oasr.cancellation import check_cancelled
from oasr.errors import ConfigError
from oasr.layers._backend import kernel

#: Kaldi's floor on mel energies and on the frame energy: float32 machine epsilon.
FLT_EPSILON = float(torch.finfo(torch.float32).eps)
#: frames per tile on the CPU (measured best on a 1 MB-L2 Zen 4 core); a multiple of :data:`_ROW_ALIGN`
TILE_FRAMES = 1024
#: frames per tile on an accelerator, where launches, not caches, are the cost
DEVICE_TILE_FRAMES = 1 << 16
_ROW_ALIGN = 32

KALDI_WINDOWS = ("povey", "hanning", "hamming", "blackman", "rectangular")


def kaldi_window(window_type: str, size: int, *, blackman_coeff: float = 0.42) -> torch.Tensor:
    """One of Kaldi's five analysis windows (symmetric, ``size`` points), computed in float64."""
    n = torch.arange(size, dtype=torch.float64)
    a = 2 * math.pi / (size - 1)
    if window_type == "hanning":
        w = 0.5 - 0.5 * torch.cos(a * n)
    elif window_type == "povey":
        w = (0.5 - 0.5 * torch.cos(a * n)).pow(0.85)
    elif window_type == "hamming":
        w = 0.54 - 0.46 * torch.cos(a * n)
    elif window_type == "blackman":
        w = blackman_coeff - 0.5 * torch.cos(a * n) + (0.5 - blackman_coeff) * torch.cos(2 * a * n)
    elif window_type == "rectangular":
        w = torch.ones(size, dtype=torch.float64)
    else:
        raise ConfigError(f"window_type {window_type!r} is not a Kaldi window; expected one of "
                          f"{', '.join(KALDI_WINDOWS)}", key="window_type")
    return w.float()


def _kaldi_mel(freq: torch.Tensor | float) -> torch.Tensor | float:
    if isinstance(freq, torch.Tensor):
        return 1127.0 * torch.log1p(freq / 700.0)
    return 1127.0 * math.log1p(freq / 700.0)


def kaldi_mel_banks(num_bins: int, n_fft: int, sample_rate: float, low_freq: float,
                    high_freq: float) -> torch.Tensor:
    """Kaldi's triangular mel filters, (num_bins, n_fft // 2 + 1) float32; the Nyquist column is 0.

    ``high_freq <= 0`` is an offset from the Nyquist frequency (Kaldi's convention).
    """
    nyquist = 0.5 * sample_rate
    if high_freq <= 0.0:
        high_freq += nyquist
    if num_bins < 3:
        raise ConfigError(f"num_mel_bins must be at least 3, got {num_bins}", key="num_mel_bins")
    if not (0.0 <= low_freq < nyquist and 0.0 < high_freq <= nyquist and low_freq < high_freq):
        raise ConfigError(
            f"mel range low_freq={low_freq} .. high_freq={high_freq} Hz must satisfy "
            f"0 <= low < high <= Nyquist ({nyquist} Hz); a negative high_freq is an offset from Nyquist",
            key="high_freq")
    mel_low, mel_high = _kaldi_mel(low_freq), _kaldi_mel(high_freq)
    delta = (mel_high - mel_low) / (num_bins + 1)
    edges = mel_low + delta * torch.arange(num_bins + 2, dtype=torch.float64)
    left, center, right = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    fft_mel = _kaldi_mel(torch.arange(n_fft // 2, dtype=torch.float64) * (sample_rate / n_fft))[None, :]
    up = (fft_mel - left) / (center - left)
    down = (right - fft_mel) / (right - center)
    banks = torch.clamp(torch.minimum(up, down), min=0.0)
    return torch.cat([banks, banks.new_zeros(num_bins, 1)], dim=1).float()


def kaldi_cepstra(num_ceps: int, num_mel_bins: int, cepstral_lifter: float) -> torch.Tensor:
    """(num_mel_bins, num_ceps) orthonormal DCT-II with Kaldi's sine lifter folded in."""
    if not 0 < num_ceps <= num_mel_bins:
        raise ConfigError(f"num_ceps must be in [1, num_mel_bins={num_mel_bins}], got {num_ceps}", key="num_ceps")
    n = torch.arange(num_mel_bins, dtype=torch.float64)[:, None]
    k = torch.arange(num_ceps, dtype=torch.float64)[None, :]
    dct = torch.cos(math.pi / num_mel_bins * (n + 0.5) * k) * math.sqrt(2.0 / num_mel_bins)
    dct[:, 0] = math.sqrt(1.0 / num_mel_bins)
    if cepstral_lifter != 0.0:
        dct = dct * (1.0 + 0.5 * cepstral_lifter * torch.sin(math.pi * k / cepstral_lifter))
    return dct.float()


#: GEMM output widths are padded to a multiple of this.  With a narrow output (fewer than 8, or 9 to 11
#: columns on AVX-512) MKL's sgemm rounds a row differently depending on where the row sits in the
#: batch; with whole 16-column blocks a row's result depends only on the row.
GEMM_COLUMNS = 16


def pad_columns(weight: torch.Tensor, rows: int | None = None) -> torch.Tensor:
    """``weight`` zero-padded to a multiple of :data:`GEMM_COLUMNS` columns (and to ``rows`` rows)."""
    rows = weight.shape[0] if rows is None else rows
    cols = -(-weight.shape[1] // GEMM_COLUMNS) * GEMM_COLUMNS
    padded = weight.new_zeros(rows, cols)
    padded[:weight.shape[0], :weight.shape[1]] = weight
    return padded


def interleave_power_weight(mel_banks: torch.Tensor) -> torch.Tensor:
    """(F, bins) filters → (2·bins, F') power→mel matrix, F' = F padded to :data:`GEMM_COLUMNS`.

    Each row is duplicated so that the squared real and imaginary parts of a spectrum
    (``view_as_real``) project on the mel bins in one GEMM, without forming ``|X|²``.
    """
    return pad_columns(mel_banks.t().repeat_interleave(2, dim=0))


def mel_groups(weight: torch.Tensor) -> tuple[tuple[int, int, int, int], ...]:
    """Blocks (row0, row1, col0, col1) of :data:`GEMM_COLUMNS` columns covering all nonzeros of ``weight``.

    Triangular mel filters are >90 % zeros; multiplying each block of filters by only the spectrum
    rows it touches does about a third of the dense GEMM's work.
    """
    weight = weight.detach().cpu()
    if weight.shape[1] % GEMM_COLUMNS:
        raise ValueError(f"weight has {weight.shape[1]} columns, not a multiple of {GEMM_COLUMNS}")
    blocks = []
    for c0 in range(0, weight.shape[1], GEMM_COLUMNS):
        rows = (weight[:, c0:c0 + GEMM_COLUMNS] != 0).any(dim=1).nonzero().flatten()
        r0, r1 = (int(rows[0]), int(rows[-1]) + 1) if rows.numel() else (0, 1)
        blocks.append((r0, r1, c0, c0 + GEMM_COLUMNS))
    return tuple(blocks)


def _project(x: torch.Tensor, weight: torch.Tensor, blocks: tuple[tuple[int, int, int, int], ...],
             out: torch.Tensor) -> torch.Tensor:
    for r0, r1, c0, c1 in blocks:
        torch.mm(x[:, r0:r1], weight[r0:r1, c0:c1], out=out[:, c0:c1])
    return out


#: columns of :func:`reflect_rows`'s index arithmetic at a time (its int64 temporaries stay a few MB
#: whatever the recording's length)
REFLECT_COLUMNS = 1 << 18


def reflect_rows(x: torch.Tensor, lengths: torch.Tensor, left: int, width: int, *,
                 repeat_edge: bool, zeros_from: torch.Tensor | None = None) -> torch.Tensor:
    """Each row's own samples ``x[b, :L_b]`` extended by reflection to ``width`` columns, starting
    ``left`` samples before the row's first sample (a negative ``left`` starts inside the row).

    ``repeat_edge=True`` is Kaldi's reflection (``x[-1] = x[0]``), ``False`` is ``torch.nn.functional.pad``'s
    ``reflect`` mode (``x[-1] = x[1]``).  Reflection repeats as often as needed, so short rows work.
    ``zeros_from`` (B,): samples at or past it read as 0, so a row of ``L_b`` samples whose first
    ``zeros_from[b]`` are in ``x`` is reflected as if its zero tail were there (it is not materialized).
    """
    if x.shape[1] == 0:
        return x.new_zeros(x.shape[0], width)
    length = lengths.clamp_min(1)[:, None]
    period = 2 * length if repeat_edge else (2 * length - 2).clamp_min(1)
    out = x.new_empty(x.shape[0], width)
    for start in range(0, width, REFLECT_COLUMNS):
        stop = min(start + REFLECT_COLUMNS, width)
        pos = torch.remainder(torch.arange(start, stop, device=x.device)[None, :] - left, period)
        pos = torch.where(pos >= length, period - 1 - pos if repeat_edge else period - pos, pos)
        zero = None if zeros_from is None else pos >= zeros_from[:, None]
        torch.gather(x, 1, pos.clamp_(max=x.shape[1] - 1).expand(x.shape[0], stop - start), out=out[:, start:stop])
        if zero is not None:
            out[:, start:stop].masked_fill_(zero, 0.0)
    return out


def _tiles(counts: list[int], tile: int) -> Iterator[tuple[int, int, int, int]]:
    """(row0, row1, frame0, frame1) tiles of at most ``tile`` frames covering every row's frames."""
    longest = max(counts, default=0)
    if longest == 0:
        return
    if longest * 2 > tile:
        for b, n in enumerate(counts):
            for f0 in range(0, n, tile):
                yield b, b + 1, f0, min(n, f0 + tile)
        return
    group = tile // longest
    for b0 in range(0, len(counts), group):
        b1 = min(len(counts), b0 + group)
        n = max(counts[b0:b1])
        if n:
            yield b0, b1, 0, n


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


_LOGS = ("floor", "guard", "log10", "none")
#: per-thread CPU workspaces, reused across calls: fresh megabyte buffers cost more in page faults
#: than a small batch costs in FFTs
_workspaces = threading.local()
_MAX_WORKSPACES = 8


def _workspace(device: torch.device, rows: int, n_fft: int, span: int, mel_cols: int,
               ceps_cols: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(frame buffer with a zero tail past ``span``, spectrum, mel, cepstra, energy) of ``rows`` rows."""
    def fresh(count: int) -> tuple:
        # normal (not inference) tensors: a workspace made under inference_mode could not be written
        # by a later call outside it
        with torch.inference_mode(False):
            return (torch.zeros(count, n_fft, device=device),
                    torch.empty(count, n_fft // 2 + 1, dtype=torch.complex64, device=device),
                    torch.empty(count, mel_cols, device=device), torch.empty(count, ceps_cols, device=device),
                    torch.ones(count, device=device))

    if device.type != "cpu":
        return fresh(rows)
    cache = getattr(_workspaces, "entries", None)
    if cache is None:
        cache = _workspaces.entries = {}
    key = (n_fft, span, mel_cols, ceps_cols)
    entry = cache.get(key)
    if entry is None or entry[0].shape[0] < rows:
        if len(cache) >= _MAX_WORKSPACES:
            cache.clear()
        entry = cache[key] = fresh(rows)
    return tuple(t[:rows] for t in entry)


def _window_frames(frames: torch.Tensor, body: torch.Tensor, window: torch.Tensor, mean: torch.Tensor | None,
                   preemphasis: float) -> None:
    """``body`` ← frames, DC-removed (``mean``), pre-emphasised within the frame, windowed."""
    if preemphasis != 0.0:
        keep = 1.0 - preemphasis
        # y[i] - c·y[i-1] of y = x - mean is x[i] - c·x[i-1] - (1 - c)·mean; y[-1] = y[0] (Kaldi)
        torch.sub(frames[..., 1:], frames[..., :-1], alpha=preemphasis, out=body[..., 1:])
        torch.mul(frames[..., :1], keep, out=body[..., :1])
        if mean is not None:
            body.sub_(mean * keep)
        body.mul_(window)
    elif mean is not None:
        torch.sub(frames, mean, out=body)
        body.mul_(window)
    else:
        torch.mul(frames, window, out=body)


def _apply_log(mel: torch.Tensor, log: str, eps: float) -> None:
    if log == "floor":
        mel.clamp_min_(eps).log_()
    elif log == "guard":
        mel.add_(eps).log_()
    elif log == "log10":
        mel.clamp_min_(eps).log10_()


def stft_mel(
    source: torch.Tensor,
    counts: list[int],
    out: torch.Tensor,
    *,
    span: int,
    hop: int,
    n_fft: int,
    window: torch.Tensor,
    mel_weight: torch.Tensor,
    mel_blocks: tuple[tuple[int, int, int, int], ...],
    num_mels: int,
    log: str = "floor",
    log_eps: float = FLT_EPSILON,
    remove_dc: bool = False,
    preemphasis: float = 0.0,
    cepstra: torch.Tensor | None = None,
    num_ceps: int = 0,
    column: int = 0,
    energy: str | None = None,
    energy_floor: float = 0.0,
    noise: torch.Tensor | None = None,
) -> None:
    """Fill ``out[b, :counts[b], column:]`` with the log-mel (or cepstral) features of frames
    ``source[b, j * hop : j * hop + span]``.

    ``source`` is (B, S) float32 with unit stride along S (a column slice of a wider buffer is fine);
    ``window`` has ``span`` points and the frame is zero-padded to ``n_fft``.  Per frame, in order:
    ``noise`` (B, N, span) is added; ``remove_dc`` subtracts the frame mean; ``preemphasis`` applies
    ``y[i] - c * y[i-1]`` within the frame with ``y[-1] = y[0]`` (Kaldi); the window multiplies.
    ``mel_weight`` is the (2 · (n_fft // 2 + 1), F') matrix of :func:`interleave_power_weight` for
    ``num_mels`` filters, ``mel_blocks`` its :func:`mel_groups`.  ``log``: ``"floor"`` =
    ``ln(max(m, log_eps))``, ``"guard"`` = ``ln(m + log_eps)``, ``"log10"`` = ``log10(max(m, log_eps))``,
    ``"none"``.  ``cepstra`` (F', C') projects the logs once more (a :func:`pad_columns`-padded DCT giving
    ``num_ceps`` outputs).  Features go to ``out[..., column:]``; ``energy`` (``"raw"``: after DC
    removal, ``"windowed"``: after the window) writes Kaldi's log frame energy, floored at
    ``FLT_EPSILON`` and ``log(energy_floor)``, to column 0.  Frames past ``counts[b]`` are 0 (``out``
    is expected to be zero-initialized).
    """
    if log not in _LOGS:
        raise ValueError(f"log must be one of {', '.join(_LOGS)}, got {log!r}")
    fast = kernel("stft_mel", source.device) if source.device.type != "cpu" else None
    if fast is not None:  # a device variant (oasr-kernels' stft_mel@cuda): same contract, fused kernels
        return fast(source, counts, out, span=span, hop=hop, n_fft=n_fft, window=window, mel_weight=mel_weight,
                    mel_blocks=mel_blocks, num_mels=num_mels, log=log, log_eps=log_eps, remove_dc=remove_dc,
                    preemphasis=preemphasis, cepstra=cepstra, num_ceps=num_ceps, column=column, energy=energy,
                    energy_floor=energy_floor, noise=noise)
    if source.stride(1) != 1:
        source = source.contiguous()
    width, row_stride, base = source.shape[1], source.stride(0), source.storage_offset()
    if counts and max(counts) > 0 and (max(counts) - 1) * hop + span > width:
        raise ValueError(f"source of {width} samples is too short for {max(counts)} frames of {span} / hop {hop}")
    bins = n_fft // 2 + 1
    feat_dim = num_mels if cepstra is None else num_ceps
    dev = source.device
    tiles = list(_tiles(counts, TILE_FRAMES if dev.type == "cpu" else DEVICE_TILE_FRAMES))
    capacity = _round_up(max(((b1 - b0) * (f1 - f0) for b0, b1, f0, f1 in tiles), default=1), _ROW_ALIGN)
    # workspaces reused by every tile (and call); rows past a tile's frames hold leftovers of earlier
    # frames, which the row-wise FFT, GEMM and log keep to their own rows, and are discarded
    ceps_cols = cepstra.shape[1] if cepstra is not None else 0
    buf, spec_ws, mel_ws, ceps_ws, energy_ws = _workspace(dev, capacity, n_fft, span, mel_weight.shape[1], ceps_cols)
    ceps_blocks = tuple((0, cepstra.shape[0], c0, c0 + GEMM_COLUMNS) for c0 in range(0, ceps_cols, GEMM_COLUMNS))

    for b0, b1, f0, f1 in tiles:
        check_cancelled()  # a tile is the unit of work an abandoned request stops after
        rows, frames_n = b1 - b0, f1 - f0
        used = rows * frames_n
        padded = _round_up(used, _ROW_ALIGN)
        frames = source.as_strided((rows, frames_n, span), (row_stride, hop, 1), base + b0 * row_stride + f0 * hop)
        if noise is not None:
            frames = frames + noise[b0:b1, f0:f1]
        body = buf[:used].view(rows, frames_n, n_fft)[..., :span]
        mean = frames.mean(-1, keepdim=True) if remove_dc else None
        if energy == "raw":
            centered = frames - mean if mean is not None else frames
            energy_ws[:used].view(rows, frames_n).copy_(centered.square().sum(-1))
        _window_frames(frames, body, window, mean, preemphasis)
        if energy == "windowed":
            energy_ws[:used].view(rows, frames_n).copy_(body.square().sum(-1))

        spec = torch.fft.rfft(buf[:padded], out=spec_ws[:padded])
        power = torch.view_as_real(spec).square_().view(padded, 2 * bins)
        mel = _project(power, mel_weight, mel_blocks, mel_ws[:padded])
        _apply_log(mel, log, log_eps)
        result = _project(mel, cepstra, ceps_blocks, ceps_ws[:padded]) if cepstra is not None else mel
        out[b0:b1, f0:f1, column:column + feat_dim] = result[:used, :feat_dim].view(rows, frames_n, feat_dim)
        if energy:
            log_energy = energy_ws[:padded].clamp_min(FLT_EPSILON).log_()
            if energy_floor > 0.0:
                log_energy.clamp_min_(math.log(energy_floor))
            out[b0:b1, f0:f1, 0] = log_energy[:used].view(rows, frames_n)
        for b in range(b0, b1):  # a row of a grouped tile may have fewer frames than the tile
            if counts[b] < f1:
                out[b, max(counts[b], f0):f1] = 0.0


def _check_lengths(waveforms: torch.Tensor, lengths: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    if waveforms.dim() != 2:
        raise ValueError(f"expected waveforms of shape (B, T), got {tuple(waveforms.shape)}")
    if lengths is None:
        lengths = torch.full((waveforms.shape[0],), waveforms.shape[1], dtype=torch.long)
    lengths = torch.as_tensor(lengths, dtype=torch.long).reshape(-1).cpu()
    if lengths.numel() != waveforms.shape[0]:
        raise ValueError(f"{lengths.numel()} lengths for {waveforms.shape[0]} waveforms")
    if lengths.numel() and (int(lengths.min()) < 0 or int(lengths.max()) > waveforms.shape[1]):
        raise ValueError(f"lengths must lie in [0, {waveforms.shape[1]}], got {lengths.tolist()}")
    return waveforms.float().contiguous(), lengths


class Fbank(nn.Module):
    """Kaldi ``compute-fbank-feats`` over a padded batch: (B, T) samples → (B, T', F) log mel energies.

    Options are Kaldi's (and ``torchaudio.compliance.kaldi.fbank``'s) with the same defaults except
    ``num_mel_bins`` (80) and ``energy_floor`` (0.0, as WeNet, FunASR and kaldi-native-fbank use).
    ``n_fft`` defaults to the window length rounded up to a power of two.  ``dither`` draws from
    torch's global generator, one ``randn(frames, window)`` per row in row order, as torchaudio does.
    With ``use_energy`` the log frame energy is column 0.
    """

    def __init__(self, *, sample_rate: float = 16000, num_mel_bins: int = 80, frame_length_ms: float = 25.0,
                 frame_shift_ms: float = 10.0, n_fft: int | None = None, window_type: str = "povey",
                 blackman_coeff: float = 0.42, preemphasis: float = 0.97, remove_dc_offset: bool = True,
                 dither: float = 0.0, snip_edges: bool = True, low_freq: float = 20.0, high_freq: float = 0.0,
                 use_energy: bool = False, raw_energy: bool = True, energy_floor: float = 0.0):
        super().__init__()
        if sample_rate <= 0:
            raise ConfigError(f"sample_rate must be positive, got {sample_rate}", key="sample_rate")
        self.win_length = int(sample_rate * frame_length_ms * 0.001)
        self.hop_length = int(sample_rate * frame_shift_ms * 0.001)
        if self.win_length < 2:
            raise ConfigError(f"frame_length_ms={frame_length_ms} gives a window of {self.win_length} samples "
                              f"at {sample_rate} Hz; need at least 2", key="frame_length_ms")
        if self.hop_length < 1:
            raise ConfigError(f"frame_shift_ms={frame_shift_ms} gives a hop of {self.hop_length} samples "
                              f"at {sample_rate} Hz; need at least 1", key="frame_shift_ms")
        self.n_fft = n_fft if n_fft is not None else 1 << (self.win_length - 1).bit_length()
        if self.n_fft < self.win_length or self.n_fft % 2:
            raise ConfigError(f"n_fft must be even and at least the window length {self.win_length}, "
                              f"got {self.n_fft}", key="n_fft")
        if not 0.0 <= preemphasis <= 1.0:
            raise ConfigError(f"preemphasis must be in [0, 1], got {preemphasis}", key="preemphasis")
        if dither < 0.0:
            raise ConfigError(f"dither must be >= 0, got {dither}", key="dither")
        self.sample_rate = sample_rate
        self.num_mel_bins = num_mel_bins
        self.window_type = window_type
        self.preemphasis = float(preemphasis)
        self.remove_dc_offset = remove_dc_offset
        self.dither = float(dither)
        self.snip_edges = snip_edges
        self.use_energy = use_energy
        self.raw_energy = raw_energy
        self.energy_floor = float(energy_floor)
        self.register_buffer("window", kaldi_window(window_type, self.win_length, blackman_coeff=blackman_coeff),
                             persistent=False)
        banks = kaldi_mel_banks(num_mel_bins, self.n_fft, sample_rate, low_freq, high_freq)
        self.register_buffer("mel_weight", interleave_power_weight(banks), persistent=False)
        self.mel_blocks = mel_groups(self.mel_weight)

    @property
    def feature_dim(self) -> int:
        return self.num_mel_bins + int(self.use_energy)

    def num_frames(self, lengths: torch.Tensor) -> torch.Tensor:
        """Frames per row: Kaldi's ``NumFrames`` for ``snip_edges`` either way."""
        lengths = torch.as_tensor(lengths, dtype=torch.long)
        if self.snip_edges:
            return torch.where(lengths >= self.win_length, 1 + (lengths - self.win_length) // self.hop_length, 0)
        return (lengths + self.hop_length // 2) // self.hop_length

    def _source(self, waveforms: torch.Tensor, lengths: torch.Tensor, longest: int) -> torch.Tensor:
        if self.snip_edges:
            return waveforms
        left = self.win_length // 2 - self.hop_length // 2
        width = (longest - 1) * self.hop_length + self.win_length
        return reflect_rows(waveforms, lengths.to(waveforms.device), left, width, repeat_edge=True)

    def _noise(self, counts: list[int], longest: int, device: torch.device) -> torch.Tensor | None:
        if self.dither == 0.0:
            return None
        noise = torch.zeros(len(counts), longest, self.win_length, device=device)
        for b, n in enumerate(counts):
            noise[b, :n] = torch.randn(n, self.win_length, device=device) * self.dither
        return noise

    def _compute(self, waveforms: torch.Tensor, lengths: torch.Tensor | None,
                 cepstra: torch.Tensor | None, feat_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        waveforms, lengths = _check_lengths(waveforms, lengths)
        frame_counts = self.num_frames(lengths)
        counts = frame_counts.tolist()
        longest = max(counts, default=0)
        out = torch.zeros(waveforms.shape[0], longest, feat_dim, device=waveforms.device)
        if longest == 0:
            return out, frame_counts
        stft_mel(
            self._source(waveforms, lengths, longest), counts, out,
            span=self.win_length, hop=self.hop_length, n_fft=self.n_fft, window=self.window,
            mel_weight=self.mel_weight, mel_blocks=self.mel_blocks, num_mels=self.num_mel_bins, log="floor",
            log_eps=FLT_EPSILON, remove_dc=self.remove_dc_offset, preemphasis=self.preemphasis, cepstra=cepstra,
            num_ceps=feat_dim if cepstra is not None else 0,
            column=1 if (self.use_energy and cepstra is None) else 0,
            energy=("raw" if self.raw_energy else "windowed") if self.use_energy else None,
            energy_floor=self.energy_floor, noise=self._noise(counts, longest, waveforms.device),
        )
        return out, frame_counts

    def forward(self, waveforms: torch.Tensor, lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T) samples and (B,) valid lengths → ((B, T', F) features, (B,) frame counts)."""
        return self._compute(waveforms, lengths, None, self.feature_dim)

    def extra_repr(self) -> str:
        return (f"num_mel_bins={self.num_mel_bins}, win={self.win_length}, hop={self.hop_length}, "
                f"n_fft={self.n_fft}, window={self.window_type!r}, snip_edges={self.snip_edges}")


class Mfcc(Fbank):
    """Kaldi ``compute-mfcc-feats``: :class:`Fbank`'s log mel energies through a DCT and sine lifter.

    With ``use_energy`` the log frame energy replaces cepstrum 0, as in Kaldi.
    """

    def __init__(self, *, num_ceps: int = 13, cepstral_lifter: float = 22.0, num_mel_bins: int = 23, **kwargs):
        super().__init__(num_mel_bins=num_mel_bins, **kwargs)
        self.num_ceps = num_ceps
        dct = kaldi_cepstra(num_ceps, num_mel_bins, cepstral_lifter)
        self.register_buffer("cepstra", pad_columns(dct, rows=self.mel_weight.shape[1]), persistent=False)

    @property
    def feature_dim(self) -> int:
        return self.num_ceps

    def forward(self, waveforms: torch.Tensor, lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return self._compute(waveforms, lengths, self.cepstra, self.num_ceps)
