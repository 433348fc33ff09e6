"""CTC greedy search on the GPU: kernel slot ``ctc_greedy_search@cuda``.

:func:`ctc_greedy_search` has the signature and results of :func:`oasr.decoding.ctc.ctc_greedy_search`:
the per-frame argmax is torch's (on the device), then :func:`_collapse_kernel` — one thread per
utterance — merges repeats, drops blanks, records each token's first frame and the best posterior of
its run, and sums the path's log-probability in float64.  One device→host copy of the (small)
results follows.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from oasr.decoding.types import Hypothesis
from oasr.errors import ConfigError
from oasr_kernels.cuda import _runtime as rt

cuda = rt.cuda()


@cuda.jit
def _collapse_kernel(ids, best, lengths, blank, tokens, frames, run_best, counts, scores):
    b = cuda.grid(1)
    if b >= ids.shape[0]:
        return
    n = lengths[b]
    k = 0
    prev = -1
    peak = -math.inf
    total = np.float64(0.0)
    for t in range(n):
        u = ids[b, t]
        lp = best[b, t]
        total += np.float64(lp)  # float64 sum (also under the simulator, where 0.0 + float32 stays float32)
        if u != prev:
            if prev >= 0 and prev != blank:
                run_best[b, k - 1] = peak
            if u != blank:
                tokens[b, k] = u
                frames[b, k] = t
                k += 1
            peak = lp
            prev = u
        elif lp > peak:
            peak = lp
    if prev >= 0 and prev != blank:
        run_best[b, k - 1] = peak
    counts[b] = k
    scores[b] = total


def check_batch(log_probs: torch.Tensor, lengths, blank: int) -> torch.Tensor:
    """``lengths`` as a (B,) int64 tensor on the log-probs' device, after core's argument checks."""
    if not isinstance(log_probs, torch.Tensor) or log_probs.dim() != 3:
        raise ConfigError(f"CTC log-probs must be a (B, T, V) tensor, got {getattr(log_probs, 'shape', type(log_probs))}",
                          key="log_probs")
    batch, frames, vocab = log_probs.shape
    lengths = torch.as_tensor(lengths, dtype=torch.long).reshape(-1)
    if lengths.shape[0] != batch:
        raise ConfigError(f"{lengths.shape[0]} lengths for a batch of {batch} rows", key="lengths")
    host = lengths.cpu()
    if batch and (int(host.min()) < 0 or int(host.max()) > frames):
        raise ConfigError(f"lengths must lie in [0, {frames}] (the frame axis), got {host.tolist()}", key="lengths")
    if not 0 <= blank < vocab:
        raise ConfigError(f"blank id {blank} is outside the vocabulary of {vocab}", key="blank")
    return lengths.to(log_probs.device).contiguous()


def ctc_greedy_search(log_probs: torch.Tensor, lengths, blank: int = 0) -> list[Hypothesis]:
    """Best path per row of ``log_probs`` (B, T, V) on the device (see the module docstring)."""
    rt.kernel_device(log_probs)
    lengths = check_batch(log_probs, lengths, blank)
    batch, frames, _ = log_probs.shape
    best, ids = log_probs.detach().float().max(dim=-1)
    best, ids = best.contiguous(), ids.contiguous()
    dev = log_probs.device
    tokens = torch.zeros(batch, max(frames, 1), dtype=torch.int64, device=dev)
    token_frames = torch.zeros_like(tokens)
    run_best = torch.zeros(batch, max(frames, 1), dtype=torch.float32, device=dev)
    counts = torch.zeros(batch, dtype=torch.int64, device=dev)
    scores = torch.zeros(batch, dtype=torch.float64, device=dev)
    block = rt.threads(batch)
    rt.launch(_collapse_kernel, -(-batch // block), block, rt.view(ids), rt.view(best), rt.view(lengths), int(blank),
              rt.view(tokens), rt.view(token_frames), rt.view(run_best), rt.view(counts), rt.view(scores))
    tokens, token_frames, run_best = tokens.cpu().numpy(), token_frames.cpu().numpy(), run_best.cpu().numpy()
    counts, scores = counts.cpu().numpy(), scores.cpu().numpy()
    results = []
    for row in range(batch):
        n = int(counts[row])
        results.append(Hypothesis(tokens=tokens[row, :n].tolist(), score=float(scores[row]),
                                  token_frames=token_frames[row, :n].tolist(),
                                  token_confidences=np.exp(run_best[row, :n].astype(np.float64)).tolist()))
    return results
