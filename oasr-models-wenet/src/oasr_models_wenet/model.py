"""The ``conformer`` architecture: WeNet U2/U2++ (Conformer encoder + CTC + optional attention decoder).

Checkpoint keys load 1:1 except for two declarative renames: the subsampling's output linear
(WeNet's ``embed.out.0`` for conv2d, ``embed.linear`` for conv2d6/8) becomes ``embed.out``, and a
plain transformer decoder's ``decoder.*`` moves under ``decoder.left_decoder.*``.  Positional tables
(``*.pe``) are computed, never read from a checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch
from torch import nn

from oasr import layers
from oasr.layers import packed
from oasr.models import BaseAsrModel, CacheSpec
from oasr.models.specs import QuantLayout
from oasr_models_wenet.config import ConformerModelConfig
from oasr_models_wenet.decoder import BiTransformerDecoder
from oasr_models_wenet.encoder import KV, ChunkOutput, ConformerEncoder


class CtcHead(nn.Module):
    """WeNet's ``CTC`` module: ``ctc_lo`` + log-softmax."""

    def __init__(self, d_model: int, vocab_size: int):
        super().__init__()
        self.ctc_lo = layers.CtcProjection(d_model, vocab_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if not packed.fusable((self.ctc_lo,), hidden):
            return packed.blocked(lambda rows: torch.log_softmax(packed.linear(self.ctc_lo, rows).float(), dim=-1),
                                  hidden)
        return self._forward_blocks(hidden)

    def _forward_blocks(self, hidden: torch.Tensor) -> torch.Tensor:
        """CPU fp32 inference: the logits of ``packed.BLOCK_ROWS`` rows at a time (the last block padded
        to a multiple of ``packed.MIN_ROWS``, the GEMM shapes :func:`packed.blocked` uses), each block's
        log-softmax written straight into its rows of the one (rows, V) output — no concatenation, and
        one vocabulary-wide allocation instead of two."""
        lead, width = hidden.shape[:-1], hidden.size(-1)
        flat = hidden.reshape(-1, width)
        rows = flat.size(0)
        out = flat.new_empty(rows, self.ctc_lo.out_features)
        for start in range(0, rows, packed.BLOCK_ROWS):
            stop = min(start + packed.BLOCK_ROWS, rows)
            part = flat[start:stop]
            pad = -(stop - start) % packed.MIN_ROWS
            logits = packed.linear(self.ctc_lo, torch.nn.functional.pad(part, (0, 0, 0, pad)) if pad else part)
            torch._log_softmax(logits[:stop - start], -1, False, out=out[start:stop])
        return out.reshape(*lead, out.size(-1))


@attrs.define
class ConformerOptions:
    """Inference options (WeNet's ``decoding_chunk_size`` / ``num_decoding_left_chunks``).

    A positive ``decoding_chunk_size`` makes offline decoding apply the chunk attention mask the
    streaming path sees, so offline and streaming transcripts of a U2/U2++ model agree.
    """

    decoding_chunk_size: int = -1
    num_decoding_left_chunks: int = -1


class ConformerModel(BaseAsrModel):
    """U2/U2++: ``encoder``, ``ctc`` and, when the checkpoint has a buildable one, ``decoder``."""

    config_class = ConformerModelConfig
    options_class = ConformerOptions
    computed_buffer_suffixes = (".pe",)
    weight_renames = (
        (r"^encoder\.embed\.(?:out\.0|linear)\.", "encoder.embed.out."),
        (r"^decoder\.(?!(?:left|right)_decoder\.)", "decoder.left_decoder."),
    )

    def __init__(self, config: ConformerModelConfig):
        super().__init__(config)
        self.encoder = ConformerEncoder(config.encoder)
        self.ctc = CtcHead(config.encoder.output_size, config.vocab_size)
        self.decoder = BiTransformerDecoder(config.decoder) if config.decoder is not None else None

    def quantization_layout(self) -> QuantLayout:
        """The CTC head, the subsampling's output projection and each block's attention output
        projection stay at full precision under int8.  Measured with benchmarks/wenet.py (WeNet-sized,
        12 x d256, vocab 5000, random weights; share of fp32 CTC argmax frames int8 keeps, two slices of
        the benchmark batches): every linear int8 96.9 %; the CTC head and embed projection kept 97.8 /
        97.8 %; plus ``linear_out`` 98.6 / 98.6 % (plus ``linear_v`` too 98.9 / 99.2 %, ``linear_pos``,
        q/k, FFN w_1 or w_2 instead: 97.8-98.1 %).  The kept layers are ~5 % of the multiply-adds."""
        outs = tuple(f"encoder.encoders.{i}.self_attn.linear_out" for i in range(self.config.encoder.num_blocks))
        return QuantLayout(keep_full_precision=("ctc", "encoder.embed") + outs)

    @property
    def capabilities(self) -> frozenset[str]:
        if self.decoder is None:
            return frozenset({"ctc"})
        return frozenset({"ctc", "ctc_aed_rescoring"})

    def encode_offline(self, feats: torch.Tensor, feat_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.encoder(feats, feat_lens, chunk_size=self.options.decoding_chunk_size,
                            num_left_chunks=self.options.num_decoding_left_chunks)

    def ctc_log_probs(self, hidden: torch.Tensor) -> torch.Tensor:
        """Encoder hidden states (B, T', D) → CTC log-probs (B, T', V), float32."""
        return self.ctc(hidden)

    def forward_offline(self, feats: torch.Tensor, feat_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden, lens = self.encode_offline(feats, feat_lens)
        return self.ctc(hidden), lens

    @property
    def cache_spec(self) -> CacheSpec | None:
        return self.encoder.cache_spec

    def encode_chunk_paged(self, feats: torch.Tensor, offsets: torch.Tensor | int, kv_cache: Sequence[KV] | None = None,
                           conv_cache: torch.Tensor | None = None, *, cache_lens: torch.Tensor | None = None,
                           feat_lens: torch.Tensor | None = None) -> ChunkOutput:
        """One streaming chunk for B streams (see :meth:`ConformerEncoder.forward_chunk`)."""
        return self.encoder.forward_chunk(feats, offsets, kv_cache, conv_cache, cache_lens=cache_lens,
                                          feat_lens=feat_lens)

    def forward_chunk_paged(self, feats: torch.Tensor, offsets: torch.Tensor | int,
                            kv_cache: Sequence[KV] | None = None, conv_cache: torch.Tensor | None = None, *,
                            cache_lens: torch.Tensor | None = None,
                            feat_lens: torch.Tensor | None = None) -> tuple[torch.Tensor, ChunkOutput]:
        """:meth:`encode_chunk_paged` + CTC head: (log-probs (B, C, V), the chunk output with its caches)."""
        out = self.encode_chunk_paged(feats, offsets, kv_cache, conv_cache, cache_lens=cache_lens, feat_lens=feat_lens)
        return self.ctc(out.hidden), out
