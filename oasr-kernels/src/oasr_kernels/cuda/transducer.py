"""Batched greedy transducer search on the GPU: kernel slot ``transducer_greedy_search@cuda``.

The prediction network and joiner stay the model's own torch code; the search talks to them through a
:class:`TransducerStep`, two calls per step for the whole batch:

- ``step.logits(frames)`` → (B, V) joiner logits of each row at encoder frame ``frames[b]`` with the
  row's current predictor output;
- ``step.emit(tokens, mask)`` advances the predictor of the rows where ``mask`` is true by ``tokens``.

Search rule (icefall's ``greedy_search`` with ``max_sym_per_frame``): at frame ``t`` the best label
(ties: the lower id) is emitted unless it is blank; a blank, or the ``max_symbols``-th symbol of the
frame, moves the row to frame ``t + 1``.  A row is done when ``t`` reaches its length.

:func:`_select_kernel` — one block per utterance — takes each row's argmax (a block reduction over
the vocabulary) and does the bookkeeping (output token and frame, frame pointer, symbols of the
frame) on the device, so a step needs no host round trip; the loop checks for completion every
:data:`CHECK_EVERY` steps.  :func:`reference_greedy_search` is the same search in plain torch (the
CPU reference the kernel is tested against).
"""

from __future__ import annotations

from typing import Protocol

import numba
import torch

from oasr.decoding.types import Hypothesis
from oasr_kernels.cuda import _runtime as rt

cuda = rt.cuda()
#: steps between the host's checks whether every row is done (each check is one device sync)
CHECK_EVERY = 4


class TransducerStep(Protocol):
    def logits(self, frames: torch.Tensor) -> torch.Tensor:
        """(B, V) joiner logits at encoder frames ``frames`` (B,) with each row's predictor output."""

    def emit(self, tokens: torch.Tensor, mask: torch.Tensor) -> None:
        """Advance the predictor of rows ``mask`` (B,) bool by ``tokens`` (B,) long."""


@cuda.jit
def _select_kernel(logits, t, lengths, sym, blank, max_symbols, tokens, frames, n_out, emitted, active):
    b = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    best_v = cuda.shared.array(rt.MAX_THREADS, numba.float32)
    best_i = cuda.shared.array(rt.MAX_THREADS, numba.int64)
    v_best = -numba.float32(3.4e38)
    i_best = -1
    for i in range(tid, logits.shape[1], nt):
        v = logits[b, i]
        if i_best < 0 or v > v_best:
            v_best = v
            i_best = i
    best_v[tid] = v_best
    best_i[tid] = i_best
    cuda.syncthreads()
    step = nt // 2
    while step > 0:
        if tid < step:
            ov = best_v[tid + step]
            oi = best_i[tid + step]
            if oi >= 0 and (best_i[tid] < 0 or ov > best_v[tid] or (ov == best_v[tid] and oi < best_i[tid])):
                best_v[tid] = ov
                best_i[tid] = oi
        cuda.syncthreads()
        step //= 2
    if tid != 0:
        return
    emitted[b] = -1
    if t[b] >= lengths[b]:
        active[b] = 0
        return
    u = best_i[0]
    if u != blank:
        k = n_out[b]
        tokens[b, k] = u
        frames[b, k] = t[b]
        n_out[b] = k + 1
        emitted[b] = u
        sym[b] += 1
        if sym[b] >= max_symbols:
            t[b] += 1
            sym[b] = 0
    else:
        t[b] += 1
        sym[b] = 0
    active[b] = 1 if t[b] < lengths[b] else 0


def _results(tokens: torch.Tensor, frames: torch.Tensor, n_out: torch.Tensor) -> list[Hypothesis]:
    tokens, frames, n_out = tokens.cpu(), frames.cpu(), n_out.cpu()
    return [Hypothesis(tokens=tokens[b, :int(n_out[b])].tolist(), score=0.0,
                       token_frames=frames[b, :int(n_out[b])].tolist()) for b in range(tokens.shape[0])]


def _check(lengths, max_symbols: int, device: torch.device) -> tuple[torch.Tensor, int]:
    if max_symbols < 1:
        raise ValueError(f"max_symbols must be at least 1, got {max_symbols}")
    lengths = torch.as_tensor(lengths, dtype=torch.long).reshape(-1)
    longest = int(lengths.max()) if lengths.numel() else 0
    return lengths.to(device).contiguous(), longest


def transducer_greedy_search(step: TransducerStep, lengths, *, blank: int = 0, max_symbols: int = 1,
                             device: torch.device | str | None = None) -> list[Hypothesis]:
    """Greedy transducer search of a batch with encoder lengths ``lengths`` (B,), on the device.

    ``score`` is not computed (0.0); tokens and their frames are."""
    device = torch.device(device) if device is not None else torch.as_tensor(lengths).device
    lengths, longest = _check(lengths, max_symbols, device)
    batch = lengths.shape[0]
    t = torch.zeros(batch, dtype=torch.long, device=device)
    sym = torch.zeros_like(t)
    n_out = torch.zeros_like(t)
    emitted = torch.full_like(t, -1)
    active = (lengths > 0).to(torch.int32)
    width = max(longest * max_symbols, 1)
    tokens = torch.zeros(batch, width, dtype=torch.long, device=device)
    frames = torch.zeros_like(tokens)
    for i in range(longest * (max_symbols + 1) + 1):
        if i % CHECK_EVERY == 0 and not bool(active.any()):
            break
        logits = step.logits(t.clamp(max=max(longest - 1, 0))).float().contiguous()
        rt.kernel_device(logits)
        rt.launch(_select_kernel, batch, rt.threads(logits.shape[1]), rt.view(logits), rt.view(t), rt.view(lengths),
                  rt.view(sym), int(blank), int(max_symbols), rt.view(tokens), rt.view(frames), rt.view(n_out),
                  rt.view(emitted), rt.view(active))
        step.emit(emitted.clamp(min=0), emitted >= 0)
    return _results(tokens, frames, n_out)


def reference_greedy_search(step: TransducerStep, lengths, *, blank: int = 0, max_symbols: int = 1) -> list[Hypothesis]:
    """The same search in plain torch (argmax and bookkeeping on the host): the kernel's reference."""
    lengths, longest = _check(lengths, max_symbols, torch.device("cpu"))
    batch = lengths.shape[0]
    t = [0] * batch
    sym = [0] * batch
    out: list[list[tuple[int, int]]] = [[] for _ in range(batch)]
    while any(t[b] < int(lengths[b]) for b in range(batch)):
        ids = step.logits(torch.tensor(t).clamp(max=max(longest - 1, 0))).float().argmax(dim=-1).tolist()
        emit = [-1] * batch
        for b in range(batch):
            if t[b] >= int(lengths[b]):
                continue
            if ids[b] != blank:
                out[b].append((ids[b], t[b]))
                emit[b] = ids[b]
                sym[b] += 1
                if sym[b] >= max_symbols:
                    t[b], sym[b] = t[b] + 1, 0
            else:
                t[b], sym[b] = t[b] + 1, 0
        emitted = torch.tensor(emit)
        step.emit(emitted.clamp(min=0), emitted >= 0)
    return [Hypothesis(tokens=[u for u, _ in row], score=0.0, token_frames=[f for _, f in row]) for row in out]
