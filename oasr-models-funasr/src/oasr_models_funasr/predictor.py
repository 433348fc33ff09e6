"""Continuous integrate-and-fire (CIF): FunASR's ``CifPredictorV2`` and ``CifPredictorV3``'s timestamp head.

The predictor always runs in float32 (FunASR disables autocast around it): a weight ``alpha`` in
[0, 1] per encoder frame, summed until it crosses ``threshold``, where a token *fires* and its
acoustic embedding is the alpha-weighted sum of the frames it covered (the crossing frame split
between the two tokens it separates).

- :func:`cif_prefix` is the vectorized integrate-and-fire of ``CifPredictorV2`` (FunASR's ``cif_v1``):
  fire positions from a float64 prefix sum of the alphas (rounded to float32, as FunASR does, so an
  accumulated rounding error never moves a fire), embeddings as differences of the float32 prefix sum
  of ``alpha * hidden`` between consecutive fires.
- :func:`cif_loop` is the sequential recurrence ``CifPredictorV3`` uses (FunASR's ``cif``), and
  :func:`cif_fires` its alphas-only form (``cif_wo_hidden``) used for timestamps.

``tail_threshold`` appends one zero frame after each row's last real frame with that alpha, so a
trailing partial token can still fire; the token count is then ``floor(sum(alphas))``.

Every row is computed as FunASR computes that utterance alone: the encoder output past a row's length
is zeroed before the convolution and the tail frame, and the timestamp head's BLSTM runs over each row's
own length.  (FunASR's batched inference reads padded encoder frames there, so its results depend on
what a request is batched with.)
"""

from __future__ import annotations

import torch
from torch import nn

from oasr import layers
from oasr_models_funasr.config import CifPredictorConfig


def cif_prefix(hidden: torch.Tensor, alphas: torch.Tensor, threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T, D) hidden, (B, T) alphas → (embeddings (B, round(max sum), D), fires (B, T))."""
    batch, _, dim = hidden.shape
    prefix = torch.cumsum(alphas, dim=1, dtype=torch.float64).to(torch.float32)
    floor = torch.floor(prefix)
    before = torch.roll(floor, 1, dims=1)
    before[:, 0] = 0
    fired = (floor - before) > 0
    fires = fired.to(alphas.dtype) + prefix - floor
    labels = int(torch.round(alphas.sum(-1)).max().item()) if batch else 0
    out = hidden.new_zeros(batch, labels, dim)
    counts = fired.sum(1)
    if labels == 0 or int(counts.sum()) == 0:
        return out, fires
    summed = torch.cumsum(alphas.unsqueeze(-1) * hidden, dim=1)
    remains = fires - torch.floor(fires)
    width = int(counts.max())
    # per row, the frame index of each fire, padded with the row's first fire (never read)
    order = torch.argsort((~fired).to(torch.int8), dim=1, stable=True)[:, :width]
    valid = torch.arange(width, device=hidden.device)[None, :] < counts[:, None]
    gather = order[..., None].expand(-1, -1, dim)
    at_fire = torch.gather(summed, 1, gather)
    remain = torch.gather(remains, 1, order)[..., None] * torch.gather(hidden, 1, gather)
    prev_sum = torch.cat([at_fire.new_zeros(batch, 1, dim), at_fire[:, :-1]], dim=1)
    prev_remain = torch.cat([remain.new_zeros(batch, 1, dim), remain[:, :-1]], dim=1)
    frames = at_fire - prev_sum + prev_remain - remain
    take = min(width, labels)
    out[:, :take] = (frames * valid[..., None])[:, :take]
    return out, fires


def cif_fires(alphas: torch.Tensor, threshold: float) -> torch.Tensor:
    """The integrate-and-fire recurrence over alphas alone: (B, T) → the integrator after each frame."""
    integrate = alphas.new_zeros(alphas.shape[0])
    fires = []
    for t in range(alphas.shape[1]):
        integrate = integrate + alphas[:, t]
        fires.append(integrate)
        integrate = torch.where(integrate >= threshold, integrate - threshold, integrate)
    return torch.stack(fires, 1) if fires else alphas.clone()


def cif_loop(hidden: torch.Tensor, alphas: torch.Tensor, threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The sequential recurrence: the same contract as :func:`cif_prefix`, FunASR's ``cif``."""
    batch, steps, dim = hidden.shape
    integrate = alphas.new_zeros(batch)
    frame = hidden.new_zeros(batch, dim)
    fires, frames = [], []
    for t in range(steps):
        alpha = alphas[:, t]
        completion = 1.0 - integrate
        integrate = integrate + alpha
        fires.append(integrate)
        fire = integrate >= threshold
        integrate = torch.where(fire, integrate - 1.0, integrate)
        cur = torch.where(fire, completion, alpha)
        frame = frame + cur[:, None] * hidden[:, t]
        frames.append(frame)
        frame = torch.where(fire[:, None], (alpha - cur)[:, None] * hidden[:, t], frame)
    fire_t = torch.stack(fires, 1) if fires else alphas.clone()
    labels = int(torch.round(alphas.sum(-1)).max().item()) if batch else 0
    out = hidden.new_zeros(batch, labels, dim)
    if steps:
        stacked = torch.stack(frames, 1)
        for b in range(batch):
            picked = stacked[b, fire_t[b] >= threshold]
            out[b, :picked.shape[0]] = picked[:labels]
    return out, fire_t


class CifPredictor(nn.Module):
    """``CifPredictorV2`` (+ ``CifPredictorV3``'s upsampled timestamp head when configured).

    Parameter names are FunASR's: ``cif_conv1d`` (a ``l_order + r_order + 1`` convolution), ``cif_output``
    (the alpha head); the timestamp head's ``upsample_cnn`` (a stride-``upsample_times`` transposed
    convolution, stored here as the equivalent linear ``upsample``), ``blstm`` and ``cif_output2``.
    """

    def __init__(self, config: CifPredictorConfig):
        super().__init__()
        self.config = config
        d = config.idim
        self.cif_conv1d = layers.Conv1d(d, d, config.l_order + config.r_order + 1,
                                        padding=(config.l_order, config.r_order))
        self.cif_output = layers.Linear(d, 1)
        if config.upsample_times > 0:
            self.upsample = layers.Linear(d, d * config.upsample_times)
            if config.upsample_type == "cnn_blstm":
                self.blstm = BiLSTM(d, d)
                self.cif_output2 = layers.Linear(2 * d, 1)
            else:
                self.blstm = None
                self.cif_output2 = layers.Linear(d, 1)

    def alphas(self, hidden: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T, D), (B, T) float mask → (per-frame alphas (B, T), conv output (B, T, D))."""
        conv = torch.relu(self.cif_conv1d(hidden))
        alphas = torch.sigmoid(self.cif_output(conv))
        cfg = self.config
        if cfg.smooth_factor != 1.0 or cfg.noise_threshold != 0.0:
            alphas = torch.relu(alphas * cfg.smooth_factor - cfg.noise_threshold)
        return alphas.squeeze(-1) * mask, conv

    def tail(self, hidden: torch.Tensor, alphas: torch.Tensor, mask: torch.Tensor | None):
        """Append the tail frame: alpha ``tail_threshold`` at each row's first padded position (every
        row's end when ``mask`` is None) and a zero hidden frame."""
        batch, _, dim = hidden.shape
        zeros = alphas.new_zeros(batch, 1)
        if mask is not None:
            edge = torch.cat([torch.ones_like(zeros), mask], dim=1) - torch.cat([mask, zeros], dim=1)
            alphas = torch.cat([alphas, zeros], dim=1) + edge * self.config.tail_threshold
        else:
            alphas = torch.cat([alphas, zeros + self.config.tail_threshold], dim=1)
        hidden = torch.cat([hidden, hidden.new_zeros(batch, 1, dim)], dim=1)
        return hidden, alphas, torch.floor(alphas.sum(-1))

    def forward(self, hidden: torch.Tensor, lengths: torch.Tensor):
        """Encoder output → (acoustic embeddings (B, N, D), token counts (B,) float, alphas, fires).

        ``alphas`` and ``fires`` include the tail frame when ``tail_threshold`` > 0.
        """
        cfg = self.config
        mask = (torch.arange(hidden.shape[1], device=hidden.device)[None, :] < lengths[:, None]).float()
        hidden = hidden.float() * mask[..., None]
        alphas, _ = self.alphas(hidden, mask)
        token_num = alphas.sum(-1)
        bicif = cfg.upsample_times > 0
        if cfg.tail_threshold > 0.0:
            hidden, alphas, token_num = self.tail(hidden, alphas, mask if (cfg.tail_mask or bicif) else None)
        embeds, fires = (cif_loop if bicif else cif_prefix)(hidden, alphas, cfg.threshold)
        if cfg.tail_threshold > 0.0:
            embeds = embeds[:, :int(token_num.max().item())]
        return embeds, token_num, alphas, fires

    def upsampled_alphas(self, hidden: torch.Tensor, lengths: torch.Tensor, token_num: torch.Tensor):
        """The timestamp head: (upsampled alphas (B, T·U), their fires) scaled to ``token_num`` tokens."""
        cfg = self.config
        batch, steps, dim = hidden.shape
        up = cfg.upsample_times
        mask = (torch.arange(steps, device=hidden.device)[None, :] < lengths[:, None]).float()
        hidden = hidden.float() * mask[..., None]
        source = torch.relu(self.cif_conv1d(hidden)) if cfg.use_cif1_cnn else hidden
        upsampled = self.upsample(source).reshape(batch, steps, dim, up).transpose(2, 3).reshape(batch, steps * up, dim)
        if self.blstm is not None:
            upsampled = self.blstm.run(upsampled, lengths * up)
        alphas = torch.sigmoid(self.cif_output2(upsampled))
        alphas = torch.relu(alphas * cfg.smooth_factor2 - cfg.noise_threshold2).squeeze(-1)
        alphas = alphas * mask.repeat_interleave(up, dim=1)
        alphas = alphas * (token_num / alphas.sum(-1))[:, None]
        return alphas, cif_fires(alphas, cfg.threshold - 1e-4)


class BiLSTM(layers.LSTM):
    """The timestamp head's one-layer bidirectional LSTM (FunASR's ``blstm``; keys ``weight_ih_l0``,
    ``weight_ih_l0_reverse`` ...)."""

    def __init__(self, input_size: int, hidden_size: int):
        nn.LSTM.__init__(self, input_size, hidden_size, 1, bias=True, batch_first=True, bidirectional=True)

    def run(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Each row over its own ``lengths`` frames (the backward pass starts at the row's end, as it
        does for that utterance alone); padded frames come back as 0."""
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = self(packed)
        return nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])[0]
