"""Token timestamps from CIF fire positions, by FunASR's ``ts_prediction_lfr6_standard`` rules.

Given the (upsampled) alphas of one utterance and the integrator after each frame (``peaks``):

- A fire is a frame whose integrator reaches ``1 - 1e-4``; fire positions are shifted by -1.5 frames.
  If there are not ``tokens + 1`` fires, the alphas are rescaled to sum to ``tokens + 1`` and the
  fires recomputed.
- A frame is ``60 ms / upsample_rate`` (LFR 6 × 10 ms).  Token ``i`` spans fire ``i`` to fire ``i + 1``,
  cut to 12 frames when longer (the rest is silence).
- The last token ends at the last frame, or, when more than 5 frames follow the last fire, halfway
  between the last fire and the last frame.
- Times are printed as whole milliseconds, truncated (``int(seconds * 1000)``).

The arithmetic (float64 seconds from numpy frame positions) follows FunASR's so the printed
milliseconds agree exactly.
"""

from __future__ import annotations

import torch

from oasr_models_funasr.predictor import cif_fires

START_END_THRESHOLD = 5
MAX_TOKEN_DURATION = 12
FORCE_TIME_SHIFT = -1.5
FIRE_THRESHOLD = 1.0 - 1e-4


def token_timestamps(alphas: torch.Tensor, peaks: torch.Tensor, num_tokens: int, *,
                     upsample_rate: int = 3, offset_ms: float = 0.0) -> list[tuple[int, int]]:
    """One utterance's (T,) alphas and peaks → ``[start_ms, end_ms]`` for each of ``num_tokens`` tokens
    (fewer when the fires cannot be made to match, as in FunASR)."""
    if num_tokens == 0:
        return []
    rate = 10.0 * 6 / 1000 / upsample_rate
    alphas = alphas.detach().float().cpu().clone()
    peaks = peaks.detach().float().cpu()
    fire = torch.where(peaks >= FIRE_THRESHOLD)[0].numpy() + FORCE_TIME_SHIFT
    if len(fire) != num_tokens + 1:
        alphas /= alphas.sum() / (num_tokens + 1)
        peaks = cif_fires(alphas[None], FIRE_THRESHOLD)[0]
        fire = torch.where(peaks >= FIRE_THRESHOLD)[0].numpy() + FORCE_TIME_SHIFT
    if len(fire) == 0:
        return []
    frames = peaks.shape[0]
    spans: list[list[float]] = []
    is_token: list[bool] = []
    if fire[0] > START_END_THRESHOLD:
        spans.append([0.0, fire[0] * rate])
        is_token.append(False)
    for i in range(len(fire) - 1):
        is_token.append(True)
        if fire[i + 1] - fire[i] <= MAX_TOKEN_DURATION:
            spans.append([fire[i] * rate, fire[i + 1] * rate])
        else:
            split = fire[i] + MAX_TOKEN_DURATION
            spans.append([fire[i] * rate, split * rate])
            spans.append([split * rate, fire[i + 1] * rate])
            is_token.append(False)
    if frames - fire[-1] > START_END_THRESHOLD:
        end = (frames + fire[-1]) * 0.5
        spans[-1][1] = end * rate
        spans.append([end * rate, frames * rate])
        is_token.append(False)
    elif spans:
        spans[-1][1] = frames * rate
    if offset_ms:
        spans = [[s + offset_ms / 1000.0, e + offset_ms / 1000.0] for s, e in spans]
    return [(int(s * 1000), int(e * 1000)) for (s, e), keep in zip(spans, is_token, strict=False) if keep]

