"""Low-frame-rate stacking (FunASR's LFR), a post-transform over any extractor's output.

Output frame ``i`` concatenates input frames ``i * n - (m - 1) // 2 + j`` for ``j < m``, indices clamped
to the row's ``[0, len - 1]`` (the first frame repeated on the left, the last on the right); a row of
``len`` frames gives ``ceil(len / n)`` frames of dimension ``m * F``.  That is FunASR ``WavFrontend``'s
``apply_lfr`` for every row, as one gather.  Offline only: streaming refuses LFR configs.
"""

from __future__ import annotations

import torch


def apply_lfr_batch(feats: torch.Tensor, lengths: torch.Tensor, lfr_m: int,
                    lfr_n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T, F) features, (B,) lengths → ((B, T', m·F), (B,) ``ceil(len / n)``); frames past a row's
    new length are 0."""
    if lfr_m < 1 or lfr_n < 1:
        raise ValueError(f"lfr_m and lfr_n must be >= 1, got {lfr_m}, {lfr_n}")
    batch, _, dim = feats.shape
    lengths = torch.as_tensor(lengths, dtype=torch.long, device=feats.device).reshape(-1)
    out_lengths = -(-lengths // lfr_n)
    longest = int(out_lengths.max()) if batch else 0
    if longest == 0:
        return feats.new_zeros(batch, 0, dim * lfr_m), out_lengths
    base = torch.arange(longest, device=feats.device)[:, None] * lfr_n
    index = base + torch.arange(lfr_m, device=feats.device)[None, :] - (lfr_m - 1) // 2
    last = (lengths - 1).clamp_min(0)[:, None, None]
    index = torch.minimum(index[None].clamp_min(0), last)
    gathered = torch.gather(feats, 1, index.reshape(batch, -1, 1).expand(-1, -1, dim))
    stacked = gathered.reshape(batch, longest, lfr_m * dim)
    valid = torch.arange(longest, device=feats.device)[None, :] < out_lengths[:, None]
    return stacked.masked_fill(~valid[..., None], 0.0), out_lengths
