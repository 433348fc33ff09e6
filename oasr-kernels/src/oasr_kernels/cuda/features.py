"""The spectral feature chain on the GPU: kernel slot ``stft_mel@cuda``.

:func:`stft_mel` has the signature and contract of :func:`oasr.features.spectral.stft_mel` (the Kaldi
fbank/MFCC, Whisper and NeMo recipes all run on it) and computes, per frame:

1. :func:`_frame_kernel` — one block per frame: the frame read straight from the padded waveform
   (no unfold copy), dither noise added, the mean removed (a block reduction), pre-emphasis within
   the frame (``y[-1] = y[0]``, Kaldi), the window, the zero tail up to ``n_fft``; the raw or
   windowed frame energy for Kaldi's ``use_energy``.
2. ``torch.fft.rfft`` (cuFFT) over all frames of the batch at once.
3. :func:`_mel_kernel` — one block per frame: ``re² + im²`` projected on each mel filter over the
   filter's nonzero bins only (triangular filters are >90 % zeros), the log (``floor`` / ``guard``
   / ``log10`` / ``none``) and the log energy, written into the output at the frame's place;
   :func:`_dct_kernel` applies the DCT and lifter for MFCC.

Numerics: float32 throughout like the CPU path; the mel sums accumulate in a different order than
the CPU's GEMM, so features agree with the CPU to float32 rounding, not bit for bit.
"""

from __future__ import annotations

import math

import numba
import numpy as np
import torch

from oasr_kernels.cuda import _runtime as rt

cuda = rt.cuda()
FLT_EPSILON = float(np.finfo(np.float32).eps)
_LOG_MODES = {"floor": 0, "guard": 1, "log10": 2, "none": 3}
_ENERGY_MODES = {None: 0, "raw": 1, "windowed": 2}
_MAX_THREADS = rt.MAX_THREADS
_INV_LN10 = 1.0 / math.log(10.0)


@cuda.jit(device=True)
def _block_sum(scratch, value):
    """Sum of ``value`` over the block's threads (a power-of-two count); every thread gets it."""
    tid = cuda.threadIdx.x
    scratch[tid] = value
    cuda.syncthreads()
    step = cuda.blockDim.x // 2
    while step > 0:
        if tid < step:
            scratch[tid] += scratch[tid + step]
        cuda.syncthreads()
        step //= 2
    total = scratch[0]
    cuda.syncthreads()
    return total


@cuda.jit(device=True)
def _sample(source, noise, has_noise, b, j, base, i):
    x = source[b, base + i]
    if has_noise:
        x += noise[b, j, i]
    return x


@cuda.jit
def _frame_kernel(source, row_b, row_j, hop, span, window, noise, has_noise, remove_dc, preemphasis,
                  energy_mode, buf, energy):
    r = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    scratch = cuda.shared.array(_MAX_THREADS, numba.float32)
    b = row_b[r]
    j = row_j[r]
    base = j * hop
    mean = numba.float32(0.0)
    if remove_dc:
        acc = numba.float32(0.0)
        for i in range(tid, span, nt):
            acc += _sample(source, noise, has_noise, b, j, base, i)
        mean = _block_sum(scratch, acc) / numba.float32(span)
    if energy_mode == 1:
        acc = numba.float32(0.0)
        for i in range(tid, span, nt):
            x = _sample(source, noise, has_noise, b, j, base, i) - mean
            acc += x * x
        e = _block_sum(scratch, acc)
        if tid == 0:
            energy[r] = e
    c = numba.float32(preemphasis)
    keep = numba.float32(1.0) - c
    acc = numba.float32(0.0)
    for i in range(tid, buf.shape[1], nt):
        if i >= span:
            buf[r, i] = 0.0
            continue
        x = _sample(source, noise, has_noise, b, j, base, i)
        if preemphasis != 0.0:
            if i == 0:
                y = x * keep
            else:
                y = x - c * _sample(source, noise, has_noise, b, j, base, i - 1)
            y -= mean * keep
        else:
            y = x - mean
        y *= window[i]
        buf[r, i] = y
        acc += y * y
    if energy_mode == 2:
        e = _block_sum(scratch, acc)
        if tid == 0:
            energy[r] = e


@cuda.jit(device=True)
def _log(value, mode, eps):
    if mode == 0:
        return math.log(max(value, eps))
    if mode == 1:
        return math.log(value + eps)
    if mode == 2:
        return math.log(max(value, eps)) * _INV_LN10
    return value


@cuda.jit(device=True)
def _log_energy(value, floor_log):
    out = math.log(max(value, numba.float32(FLT_EPSILON)))
    return max(out, floor_log)


@cuda.jit
def _mel_kernel(spec, row_b, row_j, weights, lo, hi, log_mode, log_eps, energy, energy_mode, floor_log,
                column, to_scratch, scratch, out):
    r = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    b = row_b[r]
    j = row_j[r]
    eps = numba.float32(log_eps)
    for m in range(tid, weights.shape[0], cuda.blockDim.x):
        acc = numba.float32(0.0)
        for k in range(lo[m], hi[m]):
            re = spec[r, k, 0]
            im = spec[r, k, 1]
            acc += (re * re + im * im) * weights[m, k]
        v = _log(acc, log_mode, eps)
        if to_scratch:
            scratch[r, m] = v
        else:
            out[b, j, column + m] = v
    if tid == 0 and energy_mode != 0 and not to_scratch:
        out[b, j, 0] = _log_energy(energy[r], floor_log)


@cuda.jit
def _dct_kernel(logmel, row_b, row_j, cepstra, energy, energy_mode, floor_log, column, out):
    r = cuda.blockIdx.x
    b = row_b[r]
    j = row_j[r]
    for c in range(cuda.threadIdx.x, cepstra.shape[1], cuda.blockDim.x):
        if c == 0 and energy_mode != 0:
            out[b, j, column] = _log_energy(energy[r], floor_log)
            continue
        acc = numba.float32(0.0)
        for m in range(cepstra.shape[0]):
            acc += logmel[r, m] * cepstra[m, c]
        out[b, j, column + c] = acc


def sparse_filters(mel_weight: torch.Tensor, num_mels: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(num_mels, bins) filters and each filter's nonzero bin range [lo, hi), from the interleaved
    (2·bins, F') matrix of :func:`oasr.features.spectral.interleave_power_weight` (device ops, no sync)."""
    filters = mel_weight[0::2, :num_mels].t().contiguous()
    bins = filters.shape[1]
    nonzero = filters != 0
    lo = nonzero.int().argmax(dim=1)
    hi = bins - nonzero.flip(1).int().argmax(dim=1)
    empty = ~nonzero.any(dim=1)
    lo = torch.where(empty, 0, lo).to(torch.int32).contiguous()
    hi = torch.where(empty, 0, hi).to(torch.int32).contiguous()
    return filters, lo, hi


def _row_maps(counts: list[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    counts_np = np.asarray(counts, dtype=np.int64)
    row_b = np.repeat(np.arange(len(counts), dtype=np.int32), counts_np)
    starts = np.cumsum(counts_np) - counts_np
    row_j = (np.arange(row_b.size, dtype=np.int64) - np.repeat(starts, counts_np)).astype(np.int32)
    return torch.from_numpy(row_b).to(device), torch.from_numpy(row_j).to(device)


def stft_mel(source: torch.Tensor, counts: list[int], out: torch.Tensor, *, span: int, hop: int, n_fft: int,
             window: torch.Tensor, mel_weight: torch.Tensor, mel_blocks=None, num_mels: int, log: str = "floor",
             log_eps: float = FLT_EPSILON, remove_dc: bool = False, preemphasis: float = 0.0,
             cepstra: torch.Tensor | None = None, num_ceps: int = 0, column: int = 0, energy: str | None = None,
             energy_floor: float = 0.0, noise: torch.Tensor | None = None) -> None:
    """:func:`oasr.features.spectral.stft_mel` on the GPU (``mel_blocks`` is not needed here)."""
    if log not in _LOG_MODES:
        raise ValueError(f"log must be one of {', '.join(_LOG_MODES)}, got {log!r}")
    rt.kernel_device(source)
    total = int(sum(counts))
    if total == 0:
        return
    if counts and (max(counts) - 1) * hop + span > source.shape[1]:
        raise ValueError(f"source of {source.shape[1]} samples is too short for {max(counts)} frames of "
                         f"{span} / hop {hop}")
    dev = source.device
    source = source.float().contiguous()
    row_b, row_j = _row_maps(counts, dev)
    buf = torch.empty(total, n_fft, device=dev)
    frame_energy = torch.zeros(max(total, 1), device=dev)
    has_noise = noise is not None
    noise_arg = noise.float().contiguous() if has_noise else torch.zeros(1, 1, 1, device=dev)
    energy_mode = _ENERGY_MODES[energy]
    block = rt.threads(max(span, n_fft))
    rt.launch(_frame_kernel, total, block, rt.view(source), rt.view(row_b), rt.view(row_j), hop, span,
              rt.view(window.float().contiguous()), rt.view(noise_arg), has_noise, bool(remove_dc),
              float(preemphasis), energy_mode, rt.view(buf), rt.view(frame_energy))
    spec = torch.view_as_real(torch.fft.rfft(buf)).contiguous()
    del buf
    filters, lo, hi = sparse_filters(mel_weight, num_mels)
    floor_log = math.log(energy_floor) if energy_floor > 0.0 else -math.inf
    to_scratch = cepstra is not None
    logmel = torch.empty(total if to_scratch else 1, num_mels, device=dev)
    if not out.is_contiguous():
        raise ValueError("stft_mel@cuda writes into a contiguous output")
    rt.launch(_mel_kernel, total, rt.threads(num_mels), rt.view(spec), rt.view(row_b), rt.view(row_j),
              rt.view(filters), rt.view(lo), rt.view(hi), _LOG_MODES[log], float(log_eps), rt.view(frame_energy),
              energy_mode if not to_scratch else 0, floor_log, column, to_scratch, rt.view(logmel), rt.view(out))
    if to_scratch:
        dct = cepstra[:num_mels, :num_ceps].float().contiguous()
        rt.launch(_dct_kernel, total, rt.threads(num_ceps), rt.view(logmel), rt.view(row_b), rt.view(row_j),
                  rt.view(dct), rt.view(frame_energy), energy_mode, floor_log, column, rt.view(out))
