"""WeNet's attention decoder (the U2/U2++ rescoring branch), built from :mod:`oasr.layers`.

``BiTransformerDecoder`` holds ``left_decoder`` (and, for WeNet's ``bitransformer``,
``right_decoder``, which reads the hypothesis reversed), each a pre-norm Transformer decoder whose
attribute names mirror WeNet's keys (``embed.0``, ``decoders.N.self_attn.linear_q``, ``src_attn``,
``feed_forward.w_1``, ``norm1..3``, ``after_norm``, ``output_layer``).

:meth:`BiTransformerDecoder.rescore` is the ``ctc_aed_rescoring`` decoder member: one teacher-forced
pass over every hypothesis of every utterance, scored as WeNet's ``attention_rescoring`` scores them.
Cross-attention keys and values are projected once per utterance and shared by its hypotheses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs
import torch
from torch import nn

from oasr import layers
from oasr.layers.attention import merge_heads
from oasr_models_wenet.config import TransformerDecoderConfig

ATTENTION_NAMES = ("linear_q", "linear_k", "linear_v", "linear_out")


class PositionalEncoding(nn.Module):
    """WeNet's absolute ``PositionalEncoding`` (``embed.1``): ``x * √d + pe[:T]``; ``pe`` is computed."""

    def __init__(self, d_model: int, rows: int = 5000):
        super().__init__()
        self.register_buffer("pe", layers.sinusoid_table(rows, d_model), persistent=False)
        self.xscale = math.sqrt(d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.size(1)
        if length > self.pe.size(0):
            self.pe = layers.sinusoid_table(length, self.pe.size(1)).to(self.pe)
        return x * self.xscale + self.pe[:length].to(x.dtype)


class DecoderLayer(nn.Module):
    """Pre-norm decoder block: causal self-attention, cross-attention, feed-forward."""

    def __init__(self, cfg: TransformerDecoderConfig):
        super().__init__()
        d, h = cfg.d_model, cfg.attention_heads
        self.self_attn = layers.MultiHeadAttention(
            d, h, names=ATTENTION_NAMES, bias=(cfg.query_bias, cfg.key_bias, cfg.value_bias, cfg.query_bias))
        self.src_attn = layers.MultiHeadAttention(
            d, h, names=ATTENTION_NAMES,
            bias=(cfg.src_query_bias, cfg.src_key_bias, cfg.src_value_bias, cfg.src_query_bias))
        self.feed_forward = layers.FeedForward(d, cfg.linear_units, cfg.activation_type, names=("w_1", "w_2"),
                                               bias=cfg.mlp_bias)
        self.norm1 = layers.LayerNorm(d, cfg.norm_eps)
        self.norm2 = layers.LayerNorm(d, cfg.norm_eps)
        self.norm3 = layers.LayerNorm(d, cfg.norm_eps)

    def memory_kv(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-attention keys and values of ``memory`` (B, T, d): (B, H, T, d_k) each."""
        return self.src_attn.project(memory, 1), self.src_attn.project(memory, 2)

    def forward(self, x: torch.Tensor, token_lens: torch.Tensor, memory_kv: tuple[torch.Tensor, torch.Tensor],
                memory_lens: torch.Tensor) -> torch.Tensor:
        y = self.norm1(x)
        att = self.self_attn
        q, k, v = att.project(y, 0), att.project(y, 1), att.project(y, 2)
        x = x + att.linear_out(merge_heads(att.core(q, k, v, key_lengths=token_lens, causal=True)))
        src = self.src_attn
        q = src.project(self.norm2(x), 0)
        x = x + src.linear_out(merge_heads(src.core(q, *memory_kv, key_lengths=memory_lens)))
        return x + self.feed_forward(self.norm3(x))


class TransformerDecoder(nn.Module):
    """WeNet's ``TransformerDecoder`` (pre-norm, with output layer)."""

    def __init__(self, cfg: TransformerDecoderConfig, num_blocks: int):
        super().__init__()
        self.embed = nn.Sequential(layers.Embedding(cfg.vocab_size, cfg.d_model), PositionalEncoding(cfg.d_model))
        self.decoders = nn.ModuleList(DecoderLayer(cfg) for _ in range(num_blocks))
        self.after_norm = layers.LayerNorm(cfg.d_model, cfg.norm_eps)
        self.output_layer = layers.Linear(cfg.d_model, cfg.vocab_size)
        self.n_heads = cfg.attention_heads

    def memory_kv(self, memory: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [layer.memory_kv(memory) for layer in self.decoders]

    def forward(self, tokens: torch.Tensor, token_lens: torch.Tensor,
                memory_kv: Sequence[tuple[torch.Tensor, torch.Tensor]], memory_lens: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits (N, L, V) for ``tokens`` (N, L) with ``token_lens`` (N,) over
        per-layer cross K/V (N, H, T, d_k) and ``memory_lens`` (N,)."""
        x = self.embed(tokens)
        for layer, kv in zip(self.decoders, memory_kv, strict=True):
            x = layer(x, token_lens, kv, memory_lens)
        return self.output_layer(self.after_norm(x))


@attrs.define
class RescoreResult:
    """Attention scores of one utterance's hypotheses.

    ``scores`` (N,) float32: ``(1 - reverse_weight) · left + reverse_weight · right``, each the sum of
    the hypothesis tokens' log-probabilities plus ``<eos>`` (WeNet's ``attention_rescoring`` before
    the CTC term); ``token_confidences`` per hypothesis and token (the left posterior, averaged with
    the right one when it contributes).
    """

    scores: torch.Tensor
    token_confidences: list[list[float]]


def _pad_hyps(hyps: Sequence[Sequence[int]], sos: int, eos: int, device: torch.device,
              reverse: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Decoder inputs ``[sos, y…, eos pad]`` and targets ``[y…, eos, eos pad]`` (y reversed when asked)."""
    lens = torch.tensor([len(h) for h in hyps], dtype=torch.long, device=device)
    width = int(lens.max()) + 1 if len(hyps) else 1
    inputs = torch.full((len(hyps), width), eos, dtype=torch.long, device=device)
    inputs[:, 0] = sos
    targets = torch.full((len(hyps), width), eos, dtype=torch.long, device=device)
    for i, hyp in enumerate(hyps):
        if hyp:
            seq = torch.tensor(list(reversed(hyp)) if reverse else list(hyp), dtype=torch.long, device=device)
            inputs[i, 1:1 + len(hyp)] = seq
            targets[i, :len(hyp)] = seq
    return inputs, targets, lens


class BiTransformerDecoder(nn.Module):
    """``left_decoder`` plus, when bidirectional, ``right_decoder`` (WeNet's ``BiTransformerDecoder``)."""

    def __init__(self, cfg: TransformerDecoderConfig):
        super().__init__()
        self.config = cfg
        self.left_decoder = TransformerDecoder(cfg, cfg.num_blocks)
        self.right_decoder = TransformerDecoder(cfg, cfg.r_num_blocks) if cfg.bidirectional else None

    @property
    def sos_id(self) -> int:
        return self.config.sos_id

    @property
    def eos_id(self) -> int:
        return self.config.eos_id

    def teacher_forced_log_probs(self, memory: torch.Tensor, memory_lens: torch.Tensor, tokens: torch.Tensor,
                                 token_lens: torch.Tensor, utterance: torch.Tensor, *,
                                 right: bool = False) -> torch.Tensor:
        """Log-probs (N, L, V) of decoding ``tokens`` (N, L, starting with sos) against utterance
        ``utterance[n]`` of ``memory`` (B, T, D) / ``memory_lens`` (B,); ``token_lens`` counts sos."""
        decoder = self.right_decoder if right else self.left_decoder
        kv = [(k.index_select(0, utterance), v.index_select(0, utterance)) for k, v in decoder.memory_kv(memory)]
        logits = decoder(tokens, token_lens, kv, memory_lens.index_select(0, utterance))
        return torch.log_softmax(logits.float(), dim=-1)

    def rescore(self, memory: torch.Tensor, memory_lens: torch.Tensor, hyps: Sequence[Sequence[Sequence[int]]], *,
                reverse_weight: float | None = None) -> list[RescoreResult]:
        """Score every hypothesis ``hyps[b][n]`` (token ids, no sos/eos) of utterance b against its
        encoder output ``memory[b, :memory_lens[b]]``, all in one batched teacher-forced pass.

        ``reverse_weight`` (default: the trained one) mixes in the right-to-left decoder; it is
        ignored (as in WeNet) when the decoder has no right half.
        """
        rw = self.config.reverse_weight if reverse_weight is None else float(reverse_weight)
        use_right = self.right_decoder is not None and rw > 0.0
        device = memory.device
        flat = [list(map(int, h)) for nbest in hyps for h in nbest]
        counts = [len(nbest) for nbest in hyps]
        if not flat:
            return [RescoreResult(torch.zeros(0), []) for _ in hyps]
        utterance = torch.repeat_interleave(torch.arange(len(hyps), device=device),
                                            torch.tensor(counts, device=device))
        inputs, targets, lens = _pad_hyps(flat, self.sos_id, self.eos_id, device, reverse=False)
        steps = torch.arange(inputs.size(1), device=device)[None, :] <= lens[:, None]
        left = self.teacher_forced_log_probs(memory, memory_lens, inputs, lens + 1, utterance)
        left_tok = left.gather(-1, targets.unsqueeze(-1)).squeeze(-1).masked_fill(~steps, 0.0)
        scores = left_tok.sum(-1)
        conf = left_tok.exp()
        if use_right:
            r_inputs, r_targets, _ = _pad_hyps(flat, self.sos_id, self.eos_id, device, reverse=True)
            right = self.teacher_forced_log_probs(memory, memory_lens, r_inputs, lens + 1, utterance, right=True)
            right_tok = right.gather(-1, r_targets.unsqueeze(-1)).squeeze(-1).masked_fill(~steps, 0.0)
            scores = scores * (1.0 - rw) + right_tok.sum(-1) * rw
            # token j of the hypothesis is step len - 1 - j of the reversed pass
            r_index = (lens[:, None] - 1 - torch.arange(inputs.size(1), device=device)).clamp(min=0)
            conf = (conf + right_tok.gather(1, r_index).exp()) / 2
        results, start = [], 0
        conf_list = conf.tolist()
        for count in counts:
            rows = range(start, start + count)
            results.append(RescoreResult(
                scores=scores[start:start + count],
                token_confidences=[conf_list[i][:len(flat[i])] for i in rows],
            ))
            start += count
        return results
