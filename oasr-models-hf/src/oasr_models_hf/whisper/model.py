"""Whisper on the layer waist: encoder, decoder with a batched incremental surface, and the model.

Module names are Hugging Face's (``encoder.layers.N.self_attn.q_proj`` ...) without the ``model.``
prefix, which :attr:`WhisperModel.weight_renames` strips, so an HF state dict loads 1:1.  The output
projection ``decoder.proj_out`` shares its weight with ``decoder.embed_tokens`` (every Whisper
checkpoint ties them); a native bundle stores the shared tensor once.

The decoder's incremental surface (what the ``aed`` strategy drives):

* :meth:`WhisperDecoder.prefill` runs the prompt of every row at once and returns a
  :class:`WhisperDecoderState` plus the final hidden states; prompts may differ in length per row
  (right-padded, ``lengths`` per row);
* :meth:`WhisperDecoder.step` feeds one token per row and returns the next-token logits;
* :meth:`WhisperDecoder.select` is an ``index_select`` over rows (repeats allowed: beam search
  expands a batch into B x k rows and reorders rows onto their parents with it);
* :meth:`WhisperDecoder.merge` joins two prefilled states into one batch.

Self-attention K/V live in per-row buffers written at each row's own length, so rows of different
prompt lengths and rows from different prefills share one forward.  Cross-attention K/V are
computed once per request (not per beam row) and each row points at its request's entry.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence

import attrs
import torch
import torch.nn.functional as F
from torch import nn

from oasr.errors import CapabilityError, CheckpointFormatError
from oasr.layers import (
    Embedding,
    LayerNorm,
    Linear,
    LinearActivation,
    MultiHeadAttention,
    attend,
    merge_heads,
    packed,
    split_heads,
)
from oasr.layers import rows as row_kernel
from oasr.layers._backend import kernel
from oasr.layers.derived import derived, row_major
from oasr.layers.quant import amx, int8_linear_group
from oasr.layers.rows import few_rows, row_linear, row_product
from oasr.models.base import BaseAsrModel
from oasr.models.specs import LoadReport, QuantLayout, SmoothGroup
from oasr_models_hf.whisper.config import WhisperConfig
from oasr_models_hf.whisper.encoder import ATTN_BIAS as _ATTN_BIAS
from oasr_models_hf.whisper.encoder import WhisperEncoder
from oasr_models_hf.whisper.screen import VocabScreen

#: logits of an int8 output projection recomputed in floating point per row (see WhisperDecoder.logits)
RESCORED_TOP = 8
#: the most q/k/v weights of one layer that WhisperDecoder._self_qkv keeps a stacked copy of (3 x 512²)
_STACK_QKV_MAX = 3 * 512 * 512
#: the fewest rows a decoder layer runs its linears prepacked at: at one row MKL's matrix-vector
#: product beats oneDNN's (17 vs 25-30 µs per 384 x 384 call, hot, one thread)
_PACKED_MIN_ROWS = 2
#: the most rows a vocabulary projection takes the ``row_linear`` kernel at (2.7x MKL's GEMM at 8 rows on the
#: 51,864 x 384 table, one AVX-512 thread; the step's other linears take it up to ``rows.MAX_ROWS``)
_ROW_VOCAB_MAX = 8
#: ... and an int8 vocabulary projection (16-bit activations); from 4 rows on fbgemm's int8 GEMM is faster on that
#: table
_ROW_INT8_VOCAB_MAX = 2


def _stackable(projections: Sequence[Linear]) -> bool:
    """Whether a layer's q/k/v are small enough for the decoder to keep a stacked copy (``_STACK_QKV_MAX``)."""
    return sum(p.weight.numel() for p in projections) <= _STACK_QKV_MAX


class WhisperDecoderLayer(nn.Module):
    def __init__(self, d_model: int, heads: int, ffn_dim: int):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, heads, bias=_ATTN_BIAS)
        self.self_attn_layer_norm = LayerNorm(d_model)
        self.encoder_attn = MultiHeadAttention(d_model, heads, bias=_ATTN_BIAS)
        self.encoder_attn_layer_norm = LayerNorm(d_model)
        self.fc1 = LinearActivation(d_model, ffn_dim, "gelu")
        self.fc2 = Linear(ffn_dim, d_model)
        self.final_layer_norm = LayerNorm(d_model)


@attrs.define(eq=False)
class WhisperDecoderState:
    """Per-row incremental decoder state.

    ``self_k``/``self_v``: per layer (B, H, capacity, Dh), row ``b`` holds ``lengths[b]`` positions.
    ``cross_k``/``cross_v``: per layer (N, H, Dh, S) and (N, H, S, Dh), one entry per request
    (keys stored transposed); ``cross_rows`` (B,)
    names each row's entry.  ``cross_group`` is ``g`` when the rows are the entries in order, each
    repeated ``g`` times (greedy: 1, beam search: k), which lets a step read the entries in place.
    ``uniform_length`` is the common length when every row has the same one (no key mask needed).
    ``cross_k_read`` / ``cross_v_read``: float16 copies of the cross-attention pair, where the fused step reads them.
    """

    self_k: list[torch.Tensor]
    self_v: list[torch.Tensor]
    lengths: torch.Tensor
    cross_k: list[torch.Tensor]
    cross_v: list[torch.Tensor]
    cross_rows: torch.Tensor
    cross_group: int | None
    uniform_length: int | None
    #: what the fused one-row step reads for ``cross_k`` / ``cross_v`` (``WhisperDecoder.cross_fp16``: float16
    #: copies), made at its first step and carried through ``select`` / ``merge``
    cross_k_read: list[torch.Tensor] | None = None
    cross_v_read: list[torch.Tensor] | None = None

    @property
    def batch_size(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def capacity(self) -> int:
        return int(self.self_k[0].shape[2])


def _float16_range(t: torch.Tensor) -> bool:
    """Whether every value of float32 ``t`` is finite in float16 (a nan is not).  One ``aminmax`` pass over the float32
    values: ~0.2 ms a tiny.en cross-attention cache, where a float16 copy's ``isfinite`` takes ~2.2 ms on the CPU."""
    lo, hi = t.aminmax()
    limit = torch.finfo(torch.float16).max
    return bool(lo >= -limit) and bool(hi <= limit)


def _group_size(rows: torch.Tensor, entries: int) -> int | None:
    """``g`` if ``rows`` == arange(entries).repeat_interleave(g), else None."""
    b = int(rows.shape[0])
    if entries == 0 or b % entries:
        return None
    g = b // entries
    expected = torch.arange(entries, device=rows.device).repeat_interleave(g)
    return g if torch.equal(rows, expected) else None


def _kv_projection(pair: tuple[Linear, Linear], enc_out: torch.Tensor):
    """One window's (S, D) -> (S, 2D) k and v as one GEMM, where the CPU fast path applies to ``enc_out``
    (N, S, D): both linears fp32 (prepacked) or both int8 (one fbgemm GEMM); else None."""
    if enc_out.dim() != 3 or not packed.fusable((), enc_out, min_rows=1) or enc_out.shape[1] < packed.MIN_ROWS:
        return None
    if packed.fusable(pair, enc_out):
        return lambda rows: packed.linear_group(pair, rows)
    if all(getattr(lin, "_int8", None) is not None for lin in pair):
        return lambda rows: int8_linear_group(pair, rows)
    return None


class WhisperDecoder(nn.Module):
    """Token decoder with cross-attention over the encoder output, and the incremental surface."""

    #: decoder K/V are dense per-row buffers (no paged pool), so steps are not graph-capturable
    supports_paged_kv = False
    supports_step_graphs = False
    #: the search's greedy steps project an fp32 table through :meth:`vocab_screen`: the fp32 token
    #: decisions from fewer bytes, and the exact log-probabilities from one batched fp32 product
    #: over many steps afterwards (``search._DeferredLogprobs``): the same tokens and avg_logprob as
    #: the full product.  On by default where it applies (CPU, fp32 table, fbgemm); False on an instance or the
    #: class turns it off.  What it gains depends on the core's memory bandwidth: per fp32 greedy token on tiny.en,
    #: 1.36x on an Intel Xeon core that streams ~11 GB/s, 0.98-1.05x on an AMD EPYC core that streams ~37 GB/s,
    #: where the batched product costs about what the screen saves (docs/benchmarks.md)
    screen_vocabulary = True
    #: ... and the beam search's steps too: its per-step scores rank hypotheses and take the screen's
    #: approximate normalizer (off by up to 1.6e-3 per avg_logprob on tiny.en), so opt-in
    screen_beam_vocabulary = False
    #: ... and an int8 output projection too (decisions on the fp32 table instead of its top
    #: ``RESCORED_TOP`` rescored; measured on tiny.en: the same tokens and time, so off)
    screen_int8_vocabulary = False
    #: greedy steps (rows x steps) a decoder projects through the full product before it builds the screen: building
    #: it (an int8 copy of the table, fbgemm's pack, the bound terms) costs ~0.35 s on tiny.en, what ~100 screened
    #: tokens save, so a process that decodes one short clip never pays it; every later step is screened
    screen_after_steps = 128
    #: an int8 vocabulary projection's one or two rows on the ``row_linear`` kernel (16-bit activations) rather than
    #: fbgemm's one-row GEMM; None: by the CPU.  Which is faster on the 51,864 x 384 int8 table read in a decode loop
    #: depends on the machine: the row kernel 0.93 against fbgemm's 1.50 ms on an AMD EPYC core (session 13), 1.57
    #: against 0.92 ms on an Intel Sapphire Rapids core (AMX; session 15).  So without AMX the row kernel, with it
    #: fbgemm.  Either way the top ``RESCORED_TOP`` logits are rescored exactly
    int8_vocab_row_kernel: bool | None = None
    #: a decoder whose fused one-row step reads step linears at bfloat16 (``read_bf16``: the int8 layout) reads its
    #: cross-attention at float16 there: the keys and values (a copy per decoder state, made at its first fused step;
    #: a state whose values overflow float16 keeps float32 reads), half of the 4.6 MB a tiny.en layer reads per token
    #: from them, and the q/out weights that layout keeps float32 (1.2 MB a layer).  One row, 100 greedy steps on an
    #: Intel Sapphire Rapids core (session 15): K/V 5.25 against 5.68 ms a token; the q/out weights too, 6.14 against
    #: 6.94 and 7.29 against 8.28 ms in two runs against K/V alone, the same tokens.  float16, not bfloat16: the same
    #: bytes and speed, but bfloat16 keys (8 significant bits against 11) flipped a near-tie in test_trained's int8
    #: agreement (96.8 against 97.3 %), as bfloat16 q/out weights did on the long recording (session 9); float16 keeps
    #: 97.3 %.  False: float32 reads
    cross_fp16 = True

    def __init__(self, config: WhisperConfig):
        super().__init__()
        d = config.d_model
        self.n_heads = config.decoder_attention_heads
        self.head_dim = d // self.n_heads
        self.plain_steps = 0  # greedy step rows on the full product (count_plain_steps, screen_after_steps)
        self._pinned: dict | None = None  # the fused step's arrays per kernel inside pinned_weights()
        self.embed_tokens = Embedding(config.vocab_size, d)
        self.embed_positions = Embedding(config.max_target_positions, d)
        self.layers = nn.ModuleList(
            WhisperDecoderLayer(d, self.n_heads, config.decoder_ffn_dim) for _ in range(config.decoder_layers)
        )
        self.layer_norm = LayerNorm(d)
        self.proj_out = Linear(d, config.vocab_size, bias=False)
        self.proj_out.weight = self.embed_tokens.weight

    @property
    def max_positions(self) -> int:
        return self.embed_positions.num_embeddings

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final hidden states (…, D) → vocabulary logits (…, V).

        With an int8 output projection, the ``RESCORED_TOP`` largest logits of each row are computed
        again exactly from the floating-point token embedding (the tied weight), so the tokens
        decoding picks come from full-precision scores while the other 51k logits (the softmax
        normalizer) keep the int8 product's speed (at up to ``_ROW_INT8_VOCAB_MAX`` rows the row kernel's
        product over activations on a 16-bit grid; above it fbgemm's dynamic int8 GEMM).
        """
        if self.proj_out._int8 is None:
            out = row_product(hidden, self.proj_out.weight, max_rows=_ROW_VOCAB_MAX)
            if out is not None:  # a few rows: the row kernel over the (V, D) table itself
                return out
            if hidden.device.type == "cpu" and hidden.numel() == hidden.shape[-1]:
                return hidden @ self._table_t()  # one row without the kernel: a matrix-vector product
            if packed.fusable((self.proj_out,), hidden, min_rows=_ROW_VOCAB_MAX):
                # a batched step's rows (padded to a power of two) or a prefill's: the prepacked GEMM,
                # 2x MKL's on the 51,864 x 384 table at 16 rows (one AVX-512 thread)
                return packed.blocked(lambda rows: packed.linear(self.proj_out, rows, min_rows=1), hidden, few=True)
            return self.proj_out(hidden)
        # one or two rows: the row kernel (activations on a 16-bit grid, int16 x int8 products) where it is the faster
        # (``int8_vocab_row_kernel``); more rows, or with AMX: fbgemm's dynamic int8 GEMM
        use_rows = self.int8_vocab_row_kernel
        if use_rows is None:
            use_rows = not amx()
        logits = row_linear(self.proj_out, hidden, max_rows=_ROW_INT8_VOCAB_MAX if use_rows else 0)
        if not RESCORED_TOP or not self._tied_fp_table():
            return logits
        flat, rows = logits.reshape(-1, logits.shape[-1]), hidden.reshape(-1, hidden.shape[-1])
        top = flat.topk(min(RESCORED_TOP, flat.shape[-1]), dim=-1).indices
        table = self.embed_tokens.weight
        exact = torch.matmul(table[top], rows.to(table.dtype)[:, :, None])[:, :, 0]
        flat.scatter_(1, top, exact.to(flat.dtype))
        return flat.view_as(logits)

    def _table_t(self) -> torch.Tensor:
        """The output projection transposed (D, V), contiguous: for one row on the CPU, MKL's product
        over it is about twice as fast as over the (V, D) layout (the vocabulary projection is most of a
        decode step).  Costs one more copy of the table; rebuilt when the weight changes."""
        return row_major(self, self.proj_out.weight, name="table_t")

    def _tied_fp_table(self) -> bool:
        table = self.embed_tokens.weight
        return table.is_floating_point() and tuple(table.shape) == (self.proj_out.out_features,
                                                                    self.proj_out.in_features)

    def vocab_screen(self, exact_from: int) -> VocabScreen | None:
        """The int8 screen of the output projection (:mod:`oasr_models_hf.whisper.screen`) when
        ``screen_vocabulary`` is on and this decoder can use one (CPU, fp32 table, fbgemm), else None;
        an int8 output projection (with ``screen_int8_vocabulary``) screens with its own int8 weights.
        Rebuilt when the weights change.  None until :meth:`count_plain_steps` has counted ``screen_after_steps``."""
        table = self.embed_tokens.weight
        if not self.screen_vocabulary or not self._tied_fp_table() or table.device.type != "cpu":
            return None
        if self.plain_steps < self.screen_after_steps:
            return None
        int8 = self.proj_out._int8 is not None
        if int8 and not self.screen_int8_vocabulary:
            return None
        q, scale = (self.proj_out.weight, self.proj_out.weight_scale) if int8 else (None, None)
        return derived(self, "vocab_screen", [table, q, scale], lambda: VocabScreen.build(table, exact_from, q, scale),
                       extra=exact_from, differentiable=False)

    def count_plain_steps(self, rows: int) -> None:
        """Count ``rows`` greedy step rows projected through the full product (see ``screen_after_steps``)."""
        self.plain_steps += rows

    def cross_kv(self, enc_out: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Cross-attention keys (N, H, Dh, S), already transposed for the score product, and values
        (N, H, S, Dh) of every layer for encoder output (N, S, D): computed once per request.

        On the CPU fast path each window's k and v are one GEMM (prepacked fp32, or int8 with one per-row
        scaling pass, so a window's rounding depends on its own frames), written straight into the two
        layouts: no batch-sized concatenation or transposed copy."""
        ks, vs = [], []
        for layer in self.layers:
            attn = layer.encoder_attn
            pair = (getattr(attn, attn.names[1]), getattr(attn, attn.names[2]))
            project = _kv_projection(pair, enc_out)
            if project is None:
                k, v = attn.project(enc_out, 1), attn.project(enc_out, 2)
                ks.append(k.transpose(-1, -2).contiguous())
                vs.append(v.contiguous())
                continue
            n, frames, _ = enc_out.shape
            heads = attn.n_heads
            dh = pair[0].out_features // heads
            k_t = enc_out.new_empty(n, heads, dh, frames)
            v = enc_out.new_empty(n, heads, frames, dh)
            for i in range(n):
                k_i, v_i = project(enc_out[i]).view(frames, 2, heads, dh).unbind(1)
                k_t[i].copy_(k_i.permute(1, 2, 0))
                v[i].copy_(v_i.transpose(0, 1))
            ks.append(k_t)
            vs.append(v)
        return ks, vs

    # -- the shared layer computation -------------------------------------------------------------------
    def _packed_layer(self, layer: WhisperDecoderLayer, x: torch.Tensor) -> bool:
        """Whether ``layer``'s linears run on the prepacked path: fp32 linears, CPU inference, at least
        ``_PACKED_MIN_ROWS`` rows (a batched decode step's few rows included, padded to a power of two),
        a small decoder (the bound of the stacked q/k/v below: the packed copies cost memory)."""
        if x.numel() // x.shape[-1] < _PACKED_MIN_ROWS:  # a one-row step: decided before the linears' checks
            return False
        linears = self._step_linears(layer)
        return packed.fusable(linears, x, min_rows=_PACKED_MIN_ROWS) and _stackable(linears[:3])

    @staticmethod
    def _step_linears(layer: WhisperDecoderLayer) -> list[Linear]:
        """The linears a decode step runs in ``layer``: self-attention q/k/v/out, cross-attention q/out, fc1, fc2
        (the cross-attention k/v run once per window, in :meth:`cross_kv`)."""
        sa, ca = layer.self_attn, layer.encoder_attn
        return [getattr(sa, name) for name in sa.names] + [getattr(ca, ca.names[0]), getattr(ca, ca.names[3]),
                                                           layer.fc1, layer.fc2]

    def _row_limit(self) -> int:
        """The most rows a step takes the row kernel at: ``rows.MAX_INT8_ROWS`` when every step linear is int8
        (16-bit activations there, faster than fbgemm up to that), else ``rows.MAX_ROWS``."""
        int8 = all(lin._int8 is not None for lin in self._step_linears(self.layers[0]))
        return row_kernel.MAX_INT8_ROWS if int8 else row_kernel.MAX_ROWS

    def _fused_step(self, x: torch.Tensor, state: WhisperDecoderState, write_pos: torch.Tensor) -> bool:
        """A step of at most ``rows.MAX_ROWS`` rows with every layer in one call of the ``decoder_layer_rows`` kernel
        (norms, linears, both attentions, GELU and the residual adds; ``x`` (B, 1, D) updated in place), where it
        applies: CPU float32 inference, float32 step linears, q/k/v small enough to stack, contiguous caches.
        A step linear marked ``read_bf16`` (the int8 model's, :meth:`WhisperModel.quantization_layout`) is read as a
        bfloat16 copy there, and with :attr:`cross_fp16` the cross-attention (keys, values, q/out weights) is read at
        float16, so an int8 model's one-row step differs from its op-by-op step by those roundings.
        False (nothing done) elsewhere: the op-by-op path runs."""
        fn = kernel("decoder_layer_rows") if few_rows(x) else None
        weights = None if fn is None else self._fused_weights(fn)
        if weights is None:
            return False
        caches = (*state.self_k, *state.self_v, *state.cross_k, *state.cross_v)
        if not (x.is_contiguous()
                and all(t.dtype == torch.float32 and t.is_contiguous() and t.is_cpu for t in caches)):
            return False
        rows, entries = x.view(x.shape[0], x.shape[-1]), state.cross_rows.contiguous()
        positions = write_pos.contiguous()
        cross_k, cross_v = state.cross_k, state.cross_v
        if self._cross_fp16():
            if state.cross_k_read is None:
                caches = (*cross_k, *cross_v)
                if all(_float16_range(t) for t in caches):
                    caches = tuple(t.to(torch.float16) for t in caches)
                state.cross_k_read, state.cross_v_read = list(caches[:len(cross_k)]), list(caches[len(cross_k):])
            cross_k, cross_v = state.cross_k_read, state.cross_v_read
        for i, layer_weights in enumerate(weights):
            fn(rows, positions, entries, layer_weights, state.self_k[i], state.self_v[i], cross_k[i], cross_v[i])
        return True

    def _cross_fp16(self) -> bool:
        """Whether the fused step reads the cross-attention at float16: :attr:`cross_fp16` on, and a step linear
        marked ``read_bf16`` (the int8 layout's decoder)."""
        return self.cross_fp16 and any(getattr(lin, "read_bf16", False)
                                       for layer in self.layers for lin in self._step_linears(layer))

    @contextlib.contextmanager
    def pinned_weights(self) -> Iterator[None]:
        """Inside the block the fused step's arrays (:meth:`_fused_weights`) are resolved once, not checked against
        every weight's version at each step (~0.15 ms a step on tiny.en): for a search, whose weights do not change
        while it runs.  Nested blocks share the outer one's."""
        if self._pinned is not None:
            yield
            return
        self._pinned = {}
        try:
            yield
        finally:
            self._pinned = None

    def _fused_weights(self, fn) -> list | None:
        """Each layer's arrays for the ``decoder_layer_rows`` kernel ``fn`` (its ``prepare``; kept until a weight
        changes, and inside :meth:`pinned_weights` resolved once), or None where the layers do not fit it (an int8
        or non-float32 step linear, a non-GELU MLP, q/k/v too large to stack)."""
        if self._pinned is None:
            return self._resolve_fused_weights(fn)
        if fn not in self._pinned:
            self._pinned[fn] = self._resolve_fused_weights(fn)
        return self._pinned[fn]

    def _resolve_fused_weights(self, fn) -> list | None:
        build = fn.prepare
        sources: list[torch.Tensor | None] = []
        flags: list[bool] = []
        for layer in self.layers:
            for module in (*self._step_linears(layer), *self._norms(layer)):
                sources += (module.weight, module.bias)
                flags.append(getattr(module, "read_bf16", False))

        def pair(module) -> tuple[torch.Tensor, torch.Tensor]:
            weight = module.weight
            return weight, module.bias if module.bias is not None else weight.new_zeros(weight.shape[0])

        def fits(layer: WhisperDecoderLayer) -> bool:
            linears = self._step_linears(layer)
            return (all(lin._int8 is None and lin.weight.dtype == torch.float32 and lin.weight.is_cpu
                        for lin in linears) and layer.fc1.activation == "gelu" and _stackable(linears[:3])
                    and all(n.weight is not None for n in self._norms(layer)))

        def arrays() -> list[tuple] | None:
            if not all(fits(layer) for layer in self.layers):
                return None
            out = []
            for layer in self.layers:
                norms, linears = self._norms(layer), self._step_linears(layer)
                qkv = linears[:3]
                halves = (all(p.read_bf16 for p in qkv), *(lin.read_bf16 for lin in linears[3:]))
                if cross_fp16:  # the cross-attention q/out the layout keeps float32: float16 reads
                    halves = (*halves[:2], *(h or torch.float16 for h in halves[2:4]), *halves[4:])
                out.append(build(pair(norms[0]), self._stacked(layer.self_attn, qkv), pair(linears[3]), pair(norms[1]),
                                 pair(linears[4]), pair(linears[5]), pair(norms[2]), pair(layer.fc1), pair(layer.fc2),
                                 [n.eps for n in norms], halves))
            return out

        cross_fp16 = self._cross_fp16()
        return derived(self, "fused_step", sources, arrays, extra=(*flags, cross_fp16), differentiable=False)

    @staticmethod
    def _norms(layer: WhisperDecoderLayer) -> tuple[LayerNorm, LayerNorm, LayerNorm]:
        return layer.self_attn_layer_norm, layer.encoder_attn_layer_norm, layer.final_layer_norm

    @staticmethod
    def _project_add(proj: Linear, merged: torch.Tensor, x: torch.Tensor, norm: LayerNorm, fast: bool,
                     rowwise: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """``(norm(x + proj(merged)), x + proj(merged))``, the add fused into the GEMM when ``fast`` or
        ``rowwise`` (a few rows: the ``row_linear`` kernel)."""
        if rowwise:
            x = row_linear(proj, merged, x)
            return norm(x), x
        if not fast:
            return norm.add_forward(proj(merged), x)
        x = packed.blocked(lambda rows, res: packed.linear_add(proj, rows, res, min_rows=1), merged, x, few=True)
        return norm(x), x

    @staticmethod
    def _mlp_add(layer: WhisperDecoderLayer, h: torch.Tensor, x: torch.Tensor, fast: bool, rowwise: bool = False
                 ) -> torch.Tensor:
        if rowwise:
            return row_linear(layer.fc2, row_linear(layer.fc1, h), x)
        if not fast:
            return x + layer.fc2(layer.fc1(h))

        def mlp(rows: torch.Tensor, res: torch.Tensor) -> torch.Tensor:
            hidden = packed.linear(layer.fc1, rows, layer.fc1.activation, min_rows=1)
            return packed.linear_add(layer.fc2, hidden, res, min_rows=1)

        return packed.blocked(mlp, h, x, few=True)

    def _self_qkv(self, sa: MultiHeadAttention, h: torch.Tensor, fast: bool = False, rowwise: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Self-attention q, k, v (B, H, L, Dh) of ``h``: one GEMM over the three floating-point
        projections stacked (prepacked when ``fast``), or three calls when any of them is int8 or the
        model is large.

        The stacked copy is kept for models up to ``_STACK_QKV_MAX`` weights per layer (tiny, base):
        there a decode step's linears are small and each call's fixed cost counts (measured on
        tiny.en, one thread: 3-5 % of a greedy token); in larger models the GEMMs dominate and the
        copy would only cost memory."""
        projections = [getattr(sa, name) for name in sa.names[:3]]
        if fast:
            qkv = packed.blocked(lambda rows: packed.linear_group(projections, rows, min_rows=1), h, few=True)
            return tuple(split_heads(t, self.n_heads) for t in qkv.chunk(3, dim=-1))
        if any(p._int8 is not None for p in projections) or not _stackable(projections):
            if rowwise:
                return tuple(split_heads(row_linear(p, h), self.n_heads) for p in projections)
            return sa.project(h, 0), sa.project(h, 1), sa.project(h, 2)
        weight, bias = self._stacked(sa, projections)
        b, length, d = h.shape
        qkv = row_product(h, weight, bias)
        if qkv is None:
            qkv = F.linear(h, weight, bias)
        qkv = qkv.view(b, length, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return qkv[0], qkv[1], qkv[2]

    @staticmethod
    def _stacked(sa: MultiHeadAttention, projections: list[Linear]) -> tuple[torch.Tensor, torch.Tensor]:
        """The (3D, D) weight and (3D,) bias of q/k/v stacked (a missing bias is zeros); rebuilt when
        a weight or bias changes."""
        def build() -> tuple[torch.Tensor, torch.Tensor]:
            bias = torch.cat([p.bias if p.bias is not None else p.weight.new_zeros(p.out_features) for p in projections])
            return torch.cat([p.weight for p in projections]), bias

        return derived(sa, "stacked_qkv", [t for p in projections for t in (p.weight, p.bias)], build)

    # A decode step has one query per row: explicit matmuls over the stored (transposed) keys beat the
    # fused attention kernel there, whose blocking is made for long query runs.
    def _cross(self, layer: WhisperDecoderLayer, i: int, h: torch.Tensor, state: WhisperDecoderState,
               capture: list[int] | None, max_frames: int | None, captured: list[torch.Tensor],
               fast: bool = False, rowwise: bool = False) -> torch.Tensor:
        """Cross-attention of queries from ``h`` (B, L, D), heads merged (B, L, D) before ``out_proj``."""
        attn = layer.encoder_attn
        if fast:
            q = split_heads(packed.blocked(lambda rows: packed.linear(getattr(attn, attn.names[0]), rows, min_rows=1),
                                           h, few=True), attn.n_heads)
        elif rowwise:
            q = split_heads(row_linear(getattr(attn, attn.names[0]), h), attn.n_heads)
        else:
            q = attn.project(h, 0)  # (B, H, L, Dh)
        k_t, v = state.cross_k[i], state.cross_v[i]
        b, heads, lq, dh = q.shape
        g = state.cross_group
        if g is not None:  # each entry read in place by its g rows: the rows become extra queries
            q = q.view(b // g, g, heads, lq, dh).transpose(1, 2).reshape(b // g, heads, g * lq, dh)
        else:
            k_t, v = k_t[state.cross_rows], v[state.cross_rows]

        def per_row(t: torch.Tensor) -> torch.Tensor:  # (n, H, g * L, X) → (B, H, L, X)
            return t if g is None else t.view(b // g, heads, g, lq, -1).transpose(1, 2).reshape(b, heads, lq, -1)

        scores = torch.matmul(q, k_t) * (dh ** -0.5)
        if capture is not None:
            selected = per_row(scores)[:, capture]
            if max_frames is not None:
                selected = selected[..., :max_frames]
            captured.append(selected.float().softmax(dim=-1))
        return merge_heads(per_row(torch.matmul(scores.softmax(dim=-1), v)))

    def _run_layers(self, x: torch.Tensor, state: WhisperDecoderState, write_pos: torch.Tensor | None, *,
                    capture: dict[int, list[int]] | None = None, max_frames: int | None = None,
                    captured: list[torch.Tensor] | None = None) -> torch.Tensor:
        """Run every layer over ``x`` (B, L, D).

        Prefill (``write_pos`` None): causal self-attention over the L positions, K/V stored at 0..L-1.
        Step (L == 1): K/V written at ``write_pos`` (B,) per row, attention over each row's keys.
        """
        if write_pos is not None and capture is None and self._fused_step(x, state, write_pos):
            return self.layer_norm(x)
        if write_pos is not None:
            span = (state.uniform_length if state.uniform_length is not None else int(write_pos.max())) + 1
            key_mask = None if state.uniform_length is not None else \
                (torch.arange(span, device=x.device)[None, :] > write_pos[:, None])[:, None, None, :]
        # a step of a few rows: its linears through the row kernel (more rows when they are all int8)
        rowwise = write_pos is not None and kernel("row_linear") is not None and few_rows(x, self._row_limit())
        for i, layer in enumerate(self.layers):
            sa, ca = layer.self_attn, layer.encoder_attn
            fast = not rowwise and self._packed_layer(layer, x)
            h = layer.self_attn_layer_norm(x)
            q, k, v = self._self_qkv(sa, h, fast, rowwise)
            kbuf, vbuf = state.self_k[i], state.self_v[i]
            if write_pos is None:
                length = q.shape[2]
                kbuf[:, :, :length] = k
                vbuf[:, :, :length] = v
                out = attend(q, k, v, causal=True)
            else:
                if state.uniform_length is not None:  # every row writes the same position: a slice copy
                    kbuf[:, :, span - 1:span] = k
                    vbuf[:, :, span - 1:span] = v
                else:
                    rows = torch.arange(x.shape[0], device=x.device)
                    kbuf[rows, :, write_pos] = k[:, :, 0]
                    vbuf[rows, :, write_pos] = v[:, :, 0]
                scores = torch.matmul(q, kbuf[:, :, :span].transpose(-1, -2)) * (self.head_dim ** -0.5)
                if key_mask is not None:
                    scores = scores.masked_fill(key_mask, float("-inf"))
                out = torch.matmul(scores.softmax(dim=-1), vbuf[:, :, :span])
            h, x = self._project_add(getattr(sa, sa.names[3]), merge_heads(out), x, layer.encoder_attn_layer_norm, fast,
                                     rowwise)
            layer_capture = None if capture is None else capture.get(i)
            cross = self._cross(layer, i, h, state, layer_capture, max_frames, captured, fast, rowwise)
            h, x = self._project_add(getattr(ca, ca.names[3]), cross, x, layer.final_layer_norm, fast, rowwise)
            x = self._mlp_add(layer, h, x, fast, rowwise)
        return self.layer_norm(x)

    def _new_state(self, enc_out: torch.Tensor | tuple[list[torch.Tensor], list[torch.Tensor]], batch: int,
                   capacity: int, rows: torch.Tensor | None, dtype: torch.dtype, device: torch.device
                   ) -> WhisperDecoderState:
        ks, vs = self.cross_kv(enc_out) if isinstance(enc_out, torch.Tensor) else enc_out
        entries = ks[0].shape[0]
        if rows is None:
            if entries != batch:
                raise ValueError(f"{batch} token rows but {entries} encoder outputs; pass rows= to map them")
            rows = torch.arange(batch, device=device)
        shape = (batch, self.n_heads, capacity, self.head_dim)
        return WhisperDecoderState(
            self_k=[torch.zeros(shape, dtype=dtype, device=device) for _ in self.layers],
            self_v=[torch.zeros(shape, dtype=dtype, device=device) for _ in self.layers],
            lengths=torch.zeros(batch, dtype=torch.long, device=device),
            cross_k=ks, cross_v=vs, cross_rows=rows, cross_group=_group_size(rows, entries), uniform_length=0,
        )

    def _embed(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(tokens) + self.embed_positions.weight[positions]

    # -- the incremental surface ------------------------------------------------------------------------
    def prefill(self, enc_out: torch.Tensor | tuple[list[torch.Tensor], list[torch.Tensor]], tokens: torch.Tensor,
                lengths: torch.Tensor | None = None, *, rows: torch.Tensor | None = None,
                capacity: int | None = None) -> tuple[WhisperDecoderState, torch.Tensor]:
        """Run the prompts ``tokens`` (B, L), right-padded to ``lengths`` (B,), over the encoder output.

        ``enc_out`` is (N, S, D) or precomputed :meth:`cross_kv`; ``rows`` (B,) maps each token row
        to its encoder entry (default: one row per entry).  ``capacity`` reserves decoder positions
        (it grows on demand).  Returns the state and the final hidden states (B, L, D): project the
        positions you need with :meth:`logits` (each row's last prompt token is ``lengths - 1``).
        """
        batch, length = tokens.shape
        if length > self.max_positions:
            raise CapabilityError(f"decoder prompt of {length} tokens exceeds {self.max_positions} positions")
        device = tokens.device
        dtype = self.embed_tokens.weight.dtype if not isinstance(enc_out, torch.Tensor) else enc_out.dtype
        capacity = min(max(capacity or 0, length + 1), self.max_positions)
        state = self._new_state(enc_out, batch, capacity, rows, dtype, device)
        positions = torch.arange(length, device=device)
        x = self._embed(tokens, positions[None, :].expand(batch, length))
        hidden = self._run_layers(x, state, None)
        if lengths is None:
            state.lengths.fill_(length)
            state.uniform_length = length
        else:
            state.lengths = lengths.to(device=device, dtype=torch.long).clone()
            uniform = bool((state.lengths == state.lengths[0]).all()) if batch else True
            state.uniform_length = int(state.lengths[0]) if (uniform and batch) else None
        return state, hidden

    def step(self, state: WhisperDecoderState, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (B,) at each row's next position; returns logits (B, V).  Updates ``state``."""
        return self.logits(self.step_hidden(state, tokens))

    def step_hidden(self, state: WhisperDecoderState, tokens: torch.Tensor) -> torch.Tensor:
        """:meth:`step` up to the final hidden states (B, D), before the vocabulary projection."""
        pos = state.lengths
        top = state.uniform_length if state.uniform_length is not None else int(pos.max())
        if top >= self.max_positions:
            raise CapabilityError(f"decoder reached its {self.max_positions} positions")
        if top >= state.capacity:
            self._grow(state, min(self.max_positions, max(2 * state.capacity, top + 1)))
        x = self._embed(tokens, pos)[:, None, :]
        hidden = self._run_layers(x, state, pos)
        state.lengths = pos + 1
        if state.uniform_length is not None:
            state.uniform_length += 1
        return hidden[:, 0]

    def _grow(self, state: WhisperDecoderState, capacity: int) -> None:
        extra = capacity - state.capacity
        for bufs in (state.self_k, state.self_v):
            for i, buf in enumerate(bufs):
                bufs[i] = F.pad(buf, (0, 0, 0, extra))

    def select(self, state: WhisperDecoderState, index: torch.Tensor | Sequence[int]) -> WhisperDecoderState:
        """A new state whose row ``j`` is row ``index[j]`` of ``state`` (repeats allowed)."""
        index = torch.as_tensor(index, dtype=torch.long, device=state.lengths.device)
        lengths = state.lengths.index_select(0, index)
        span = state.uniform_length if state.uniform_length is not None else (
            int(state.lengths.max()) if state.batch_size else 0)

        def pick(buf: torch.Tensor) -> torch.Tensor:
            out = buf.new_zeros((index.shape[0],) + tuple(buf.shape[1:]))
            out[:, :, :span] = buf[:, :, :span].index_select(0, index)
            return out

        rows = state.cross_rows.index_select(0, index)
        cross_k, cross_v = state.cross_k, state.cross_v
        entries = cross_k[0].shape[0]
        used, inverse = torch.unique(rows, sorted=True, return_inverse=True)
        read_k, read_v = state.cross_k_read, state.cross_v_read
        if used.shape[0] < entries:  # drop encoder entries no row reads any more
            cross_k = [k.index_select(0, used) for k in cross_k]
            cross_v = [v.index_select(0, used) for v in cross_v]
            if read_k is not None:
                read_k = [k.index_select(0, used) for k in read_k]
                read_v = [v.index_select(0, used) for v in read_v]
            rows, entries = inverse, used.shape[0]
        return WhisperDecoderState(
            self_k=[pick(b) for b in state.self_k], self_v=[pick(b) for b in state.self_v], lengths=lengths,
            cross_k=cross_k, cross_v=cross_v, cross_rows=rows, cross_group=_group_size(rows, entries),
            uniform_length=state.uniform_length, cross_k_read=read_k, cross_v_read=read_v,
        )

    @staticmethod
    def can_merge(a: WhisperDecoderState, b: WhisperDecoderState) -> bool:
        return (len(a.self_k) == len(b.self_k) and a.self_k[0].dtype == b.self_k[0].dtype
                and a.self_k[0].device == b.self_k[0].device
                and a.cross_k[0].shape[1:] == b.cross_k[0].shape[1:])

    def merge(self, a: WhisperDecoderState, b: WhisperDecoderState) -> WhisperDecoderState:
        """One state holding the rows of ``a`` then those of ``b`` (see :meth:`can_merge`)."""
        if not self.can_merge(a, b):
            raise ValueError("these decoder states cannot be merged (different layers, dtype, device or encoder length)")
        capacity = max(a.capacity, b.capacity)

        def widen(buf: torch.Tensor) -> torch.Tensor:
            return F.pad(buf, (0, 0, 0, capacity - buf.shape[2])) if buf.shape[2] < capacity else buf

        rows = torch.cat([a.cross_rows, b.cross_rows + a.cross_k[0].shape[0]])
        entries = a.cross_k[0].shape[0] + b.cross_k[0].shape[0]
        uniform = a.uniform_length if a.uniform_length is not None and a.uniform_length == b.uniform_length else None
        read_k = read_v = None  # made again at the next fused step unless both states have them, of one dtype
        if a.cross_k_read is not None and b.cross_k_read is not None and a.cross_k_read[0].dtype == b.cross_k_read[0].dtype:
            read_k = [torch.cat([x, y]) for x, y in zip(a.cross_k_read, b.cross_k_read, strict=True)]
            read_v = [torch.cat([x, y]) for x, y in zip(a.cross_v_read, b.cross_v_read, strict=True)]
        return WhisperDecoderState(
            self_k=[torch.cat([widen(x), widen(y)]) for x, y in zip(a.self_k, b.self_k, strict=False)],
            self_v=[torch.cat([widen(x), widen(y)]) for x, y in zip(a.self_v, b.self_v, strict=False)],
            lengths=torch.cat([a.lengths, b.lengths]),
            cross_k=[torch.cat([x, y]) for x, y in zip(a.cross_k, b.cross_k, strict=False)],
            cross_v=[torch.cat([x, y]) for x, y in zip(a.cross_v, b.cross_v, strict=False)],
            cross_rows=rows, cross_group=_group_size(rows, entries), uniform_length=uniform,
            cross_k_read=read_k, cross_v_read=read_v,
        )

    # -- teacher-forced passes --------------------------------------------------------------------------
    def forward(self, tokens: torch.Tensor, enc_out: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits (B, L, V) for ``tokens`` (B, L) over encoder output (B, S, D)."""
        _, hidden = self.prefill(enc_out, tokens)
        return self.logits(hidden)

    def cross_attention(self, enc_out: torch.Tensor, token_ids: torch.Tensor, heads: Sequence[tuple[int, int]],
                        max_frames: int | None = None, *, logits: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-attention probabilities of ``heads`` ((layer, head) pairs) and the logits of one pass.

        Returns (B, len(heads), L, F) probabilities (softmax over the first ``max_frames`` encoder
        frames) and (B, L, V) logits, for ``token_ids`` (B, L) teacher-forced over ``enc_out``;
        ``logits=False`` returns the final hidden states (B, L, D) instead, for a caller that projects a
        few rows at a time (a window's logits are ~40 MB).
        """
        heads = [(int(layer), int(head)) for layer, head in heads]
        if not heads:
            raise CapabilityError("cross_attention needs at least one (layer, head) pair")
        capture: dict[int, list[int]] = {}
        for layer, head in heads:
            capture.setdefault(layer, []).append(head)
        batch, length = token_ids.shape
        state = self._new_state(enc_out, batch, length, None, enc_out.dtype, enc_out.device)
        positions = torch.arange(length, device=token_ids.device)
        x = self._embed(token_ids, positions[None, :].expand(batch, length))
        captured: list[torch.Tensor] = []
        hidden = self._run_layers(x, state, None, capture=capture, max_frames=max_frames, captured=captured)
        per_layer = dict(zip(sorted(capture), captured, strict=False))
        order = {layer: {head: j for j, head in enumerate(capture[layer])} for layer in capture}
        probs = torch.stack([per_layer[layer][:, order[layer][head]] for layer, head in heads], dim=1)
        return probs, self.logits(hidden) if logits else hidden


class WhisperModel(BaseAsrModel):
    """Whisper: encoder + autoregressive decoder, decoded by the ``aed`` family."""

    config_class = WhisperConfig
    weight_renames = ((r"^model\.", ""),)

    def __init__(self, config: WhisperConfig):
        super().__init__(config)
        self.encoder = WhisperEncoder(config)
        self.decoder = WhisperDecoder(config)

    @property
    def capabilities(self) -> frozenset[str]:
        return frozenset({"aed"})

    def _tied(self) -> bool:
        return self.decoder.proj_out.weight is self.decoder.embed_tokens.weight

    def is_computed_buffer(self, key: str) -> bool:
        # The tied output projection is the embedding table: never required from, nor written to, a file.
        if key == "decoder.proj_out.weight" and self._tied():
            return True
        return super().is_computed_buffer(key)

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> LoadReport:
        """HF-layout weights (with or without ``model.``); a stored ``proj_out.weight`` must equal the
        token embedding it is tied to (it is then dropped as declared-unused)."""
        tied = state_dict.get("proj_out.weight")
        embed = state_dict.get("model.decoder.embed_tokens.weight", state_dict.get("decoder.embed_tokens.weight"))
        if tied is not None and embed is not None and tied.shape == embed.shape and not torch.equal(tied, embed):
            raise CheckpointFormatError("proj_out.weight differs from decoder.embed_tokens.weight; OASR's Whisper "
                                        "ties them as every Whisper checkpoint does")
        return super().load_weights(state_dict)

    def encode_offline(self, feats: torch.Tensor, feat_lens: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-mel (B, T, n_mels) → (B, T/2, D); Whisper attends over the whole window, so the
        returned lengths are all T/2 whatever ``feat_lens`` says."""
        out = self.encoder(feats)
        return out, torch.full((out.shape[0],), out.shape[1], dtype=torch.long, device=out.device)

    def quantization_layout(self) -> QuantLayout:
        """Each pre-norm feeds the projections after it (declared SmoothQuant groups, not applied:
        calibrated SmoothQuant folds measured no gain, see below).  Kept at full precision:

        * the encoder's ``fc2`` layers: their input (the GELU of 4 x d_model channels) carries
          outlier channels that 8 bits round away;
        * the decoder's step linears (self-attention q/k/v/out, cross-attention q/out, fc1, fc2):
          they are a third of int8's noise on the tokens (teacher-forced rms change of fp32's top-1
          lead 0.114 logits with them fp32, 0.152 int8).  At int8 a one-row step would be faster
          (8.9 vs 10.3 ms per greedy token on the loaded box: one row goes to fbgemm unscaled), so
          this is accuracy bought with decoder speed.  The cross-attention k/v projections (1500
          frames, once per window) and the vocabulary projection (its top logits rescored in fp32)
          stay int8.  Of the step linears, self-attention q/k/v/out, fc1 and fc2 are read at bfloat16
          by the fused one-row step (``read_bf16``: float32 compute over half the bytes of a bandwidth-bound
          step, ~0.2 ms of a layer's 0.6 ms cold): on the benchmark's 34 clips at one row every token is kept
          (98.4 % agreement with fp32 either way) and on the 141.5 s recording too (94.7 %); with the
          cross-attention q/out also bf16 the recording loses one near-tie (93.7 %, WER 14.7 -> 15.0 %),
          so those two stay float32 reads (docs/benchmarks.md, session 9).

        Measured on tiny.en, greedy, batch 16, 39 clips (the int8 test's 7 + the benchmark's 32
        sentences; docs/benchmarks.md, "int8 step, session 5"): this layout keeps 97.7 % of the fp32
        tokens free-running (1 - token edit distance / fp32 tokens) but 95.2 % on the test's 7 clips,
        where one 10-token sentence loses 4 tokens to a near-tie under nearly every layout; the
        decoder step linears int8 97.5 % / 95.2 %.  Earlier runs of the same layout (other fp32
        kernels) measured 96.1 % / 94.7 %: the free-running figure moves by ~1.5 points with the
        float noise of the fp32 reference, because 16 % of fp32's greedy steps on these clips lead
        by under 0.5 logits and a flipped near-tie rewrites the rest of a sentence.  Neither
        activation tricks (pinned or per-row asymmetric grids, LLM.int8-style fp32 outlier columns),
        group-wise weight scales nor calibrated SmoothQuant (alpha 0.5-0.8) reached 97 % on both
        sets, and CTranslate2's int8 keeps 95.7-96.6 % of its own fp32 on the same clips.
        The convolutions and embeddings are not linears."""
        groups = []
        for prefix, layers in (("encoder", self.encoder.layers), ("decoder", self.decoder.layers)):
            for i, layer in enumerate(layers):
                base = f"{prefix}.layers.{i}"
                groups.append(SmoothGroup(f"{base}.self_attn_layer_norm",
                                          tuple(f"{base}.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj"))))
                if hasattr(layer, "encoder_attn"):
                    groups.append(SmoothGroup(f"{base}.encoder_attn_layer_norm", (f"{base}.encoder_attn.q_proj",)))
                groups.append(SmoothGroup(f"{base}.final_layer_norm", (f"{base}.fc1",)))
        keep = tuple(f"encoder.layers.{i}.fc2" for i in range(len(self.encoder.layers)))
        step = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj",
                "encoder_attn.q_proj", "encoder_attn.out_proj", "fc1", "fc2")
        n_dec = len(self.decoder.layers)
        kept_step = tuple(f"decoder.layers.{i}.{name}" for i in range(n_dec) for name in step)
        # the one-row step reads these at bfloat16 (the cross-attention q/out stay float32 reads, see above)
        halves = tuple(f"decoder.layers.{i}.{name}" for i in range(n_dec) for name in step if "encoder_attn" not in name)
        return QuantLayout(smooth_groups=tuple(groups), keep_full_precision=keep + kept_step, read_bf16=halves)

    def extra_repr(self) -> str:
        c = self.config
        return (f"d_model={c.d_model}, encoder_layers={c.encoder_layers}, decoder_layers={c.decoder_layers}, "
                f"vocab={c.vocab_size}, n_mels={c.num_mel_bins}")


__all__ = ["WhisperDecoder", "WhisperDecoderState", "WhisperEncoder", "WhisperModel"]
