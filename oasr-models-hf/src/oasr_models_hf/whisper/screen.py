"""An int8 screen of Whisper's vocabulary projection whose token decisions are the fp32 decisions.

One decode step reads the whole (V, D) vocabulary table (tiny.en: 51,864 x 384, 80 MB at fp32, most of
a step's bytes).  :class:`VocabScreen` reads an int8 copy instead (20 MB: at one or two rows the ``row_linear``
kernel's int16 x int8 product, more rows fbgemm's dynamic int8 GEMM) and bounds the error of every approximate
logit rigorously; the logits that can still win are then
computed again from the fp32 table (a gather of the few rows whose upper bound reaches the decision
threshold), and so are every id from end-of-text on (the specials and the timestamps, which the
timestamp rule sums over).

The bound, per row ``h`` of the block passed to fbgemm and vocabulary row ``W_r``:
``|h.W_r - h^.W^_r| <= (s_h / 2) ||W_r||_1 + ||h^||_1 max|W_r - W^_r| + float terms``, where
``s_h = (max(h, 0) - min(h, 0)) / qmax`` is the step of fbgemm's uint8 grid over the block (qmax 255,
or 127 with ``reduce_range``), ``W^_r = s_r q_r`` the per-row symmetric int8 weight; the float terms
cover fbgemm's float dequantization and the rounding of an fp32 dot product of length D (both
``<= (D + 8) u ||h||_1 max|W_r|``).  fbgemm accumulates in int32: with VNNI (``vpdpbusd``) nothing
saturates; without it, 7-bit activations (``reduce_range``) keep its 16-bit pair sums below 2^15.  The
screen checks this once on a worst-case probe (8-bit activations where that comes out exact, else
7-bit ones) and stays off if neither does.

What is exact after :meth:`VocabScreen.resolve` with ``k`` (greedy: 1; openai-style beam search:
beam + 1), the logit rules' masks already applied to the approximate logits:

* every logit that can be among the row's ``k`` largest, and (rows with timestamp rules) every
  logit that can be the largest text logit, plus all ids from end-of-text on: these are fp32 dot
  products of the hidden state with the fp32 table rows (the full product's own kernel over the
  gathered rows; it may differ from the full product in the last bit, as any two fp32 GEMM shapes
  may), so the argmax, the top ``k`` and the timestamp rule (the log-sum-exp of the timestamp logits
  against the best text logit) decide as the fp32 product does;
* every other logit is approximate and provably below the decision threshold;
* not exact: the log-softmax normalizer (it sums every logit), so a log-probability taken from
  the screened row carries an error (tiny.en's 34 benchmark clips: ``avg_logprob`` within 1.6e-3,
  mean 4.7e-4; docs/benchmarks.md, "int8-screened vocabulary projection").  The greedy search
  therefore takes its log-probabilities from a batched fp32 product of many steps' hidden states
  afterwards (exact; :attr:`WhisperDecoder.screen_vocabulary`, on by default); the beam search,
  whose scores rank hypotheses at every step, screens only with
  :attr:`WhisperDecoder.screen_beam_vocabulary` (opt-in).

When more than :data:`MAX_EXACT` text rows would need recomputing (a flat distribution) ``resolve``
returns False and the caller takes the full fp32 product.  Sampling and the prefill (first token,
no-speech probability) always use the full product.
"""

from __future__ import annotations

import warnings

import attrs
import numpy as np
import torch
import torch.nn.functional as F

from oasr.layers._backend import kernel
from oasr.layers.quant import quantize_rows

#: the most text rows recomputed per step before the full fp32 product is cheaper
MAX_EXACT = 2048
_U = 2.0**-24  # fp32 unit roundoff
#: fbgemm's quantization of an activation: round-to-nearest on its grid, plus its float slop
_HALF_STEP = 0.5 * (1 + 1e-4)
#: below this half step fbgemm widens the activation range itself: its grid is no longer the one assumed
_FBGEMM_MIN_HALF_STEP = 1e-4
#: the most rows the screened product takes the ``row_linear`` kernel at: at one row 0.93 against fbgemm's 1.5 ms
#: on tiny.en's table read cold (1.35 against 1.66 ms at two), from four rows on fbgemm is faster (one AVX-512
#: VNNI core; docs/benchmarks.md, session 13)
ROW_KERNEL_MAX = 2
#: ... and where fbgemm keeps 7-bit activations (no VNNI: ``reduce_range``), up to this many rows: its grid is then
#: so coarse against the row kernel's that the bound seldom decides a step of several rows (tiny.en's beam of 5 on
#: beckett and sample.wav: 2 steps decided on fbgemm, on an AVX2 core)
ROW_KERNEL_MAX_REDUCED = 8
#: the row kernel's rounding of an activation: half its grid step, plus float32 slop below 4 % of a step (its
#: ``step`` contract), with margin
_ROW_HALF_STEP = 0.55


def _fbgemm() -> bool:
    return "fbgemm" in torch.backends.quantized.supported_engines


def _pack(q: torch.Tensor, scale: torch.Tensor):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch marks quantized tensor constructors as deprecated
        scales = scale.double()
        qweight = torch._make_per_channel_quantized_tensor(q, scales, torch.zeros_like(scales, dtype=torch.long), 0)
        return torch.ops.quantized.linear_prepack(qweight, None)


def accumulates_exactly(reduce_range: bool, dim: int) -> bool:
    """Whether fbgemm's int8 product is exact in int32 on this machine: a worst case for 16-bit pair
    sums (every activation at the top of its grid, every weight at +-127) must come out undisturbed."""
    if not _fbgemm():
        return False
    q = torch.full((2, dim), 127, dtype=torch.int8)
    q[1] = -127
    packed = _pack(q, torch.ones(2))
    x = torch.ones(1, dim)  # min 0, max 1: every element quantizes to the top of the grid
    out = torch.ops.quantized.linear_dynamic(x, packed, reduce_range)
    expected = torch.tensor([[127.0 * dim, -127.0 * dim]])
    return bool(torch.allclose(out, expected, rtol=1e-5, atol=1e-3))


@attrs.define
class Screened:
    """Approximate logits (n, V) of a block of hidden states and what their bound needs per row."""

    logits: torch.Tensor
    hidden: torch.Tensor
    half_step: float  # half the step of the activation grid the product used (the block's, or its widest row's)
    h_norm: torch.Tensor  # (n,) upper bounds of ||h^||_1
    min_half_step: float = _FBGEMM_MIN_HALF_STEP  # a smaller half step: the grid is not the one assumed

    def take(self, index: list[int]) -> Screened:
        i = torch.tensor(index, device=self.logits.device)
        return Screened(self.logits[i], self.hidden[i], self.half_step, self.h_norm[i], self.min_half_step)


class VocabScreen:
    """The int8 screen of a (V, D) fp32 vocabulary table; ids ``>= exact_from`` are always exact.

    ``q`` / ``scale``: an existing per-row symmetric int8 copy (``W ~ q * scale[:, None]``, the
    int8 model's own output projection); default: quantized here from ``table``.
    """

    def __init__(self, table: torch.Tensor, exact_from: int, q: torch.Tensor | None = None,
                 scale: torch.Tensor | None = None, reduce_range: bool = False):
        w = table.detach().float()
        self.table = w
        self.exact_from = exact_from
        self.reduce_range = reduce_range
        self.qmax = 127.0 if reduce_range else 255.0
        slack = 1 + 1e-6
        terms = kernel("screen_table_terms") if q is None or scale is None else None
        if terms is not None and w.is_cpu and w.is_contiguous():
            # one pass over the table (oasr-kernels): ~0.05 against ~0.75 s of torch passes on tiny.en's 80 MB
            q, scale, self.w_norm, self.w_err = terms(w, exact_from, slack)
        else:
            if q is None or scale is None:
                q, scale = quantize_rows(w)
            self.w_norm, self.w_err = self._bound_terms(w, q, scale, exact_from, slack)
        self.q, self.scale = q.contiguous(), scale.float().contiguous()
        self._packed = None  # fbgemm's pack of (q, scale): built for the first block of more rows
        self.w_norm_max, self.w_err_max = float(self.w_norm.max()), float(self.w_err.max())
        self._cols = np.empty(exact_from, np.int64)  # the one-row resolve kernel's scratch (candidate ids)

    @staticmethod
    def _bound_terms(w: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, exact_from: int, slack: float
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per text row: ||W_r||_1, and max|W_r - W^_r| plus the float terms (per unit of ||h||_1), in float64."""
        w64, dq = w[:exact_from].double(), q[:exact_from].double() * scale[:exact_from].double()[:, None]
        float_terms = (w.shape[1] + 8) * _U * torch.maximum(w64.abs().amax(dim=1), dq.abs().amax(dim=1))
        return ((w64.abs().sum(dim=1) * slack).float(),
                (((w64 - dq).abs().amax(dim=1) + float_terms) * slack).float())

    @classmethod
    def build(cls, table: torch.Tensor, exact_from: int, q: torch.Tensor | None = None,
              scale: torch.Tensor | None = None) -> VocabScreen | None:
        """A screen for this machine's fbgemm, or None where its int8 product is not provably exact:
        full 8-bit activations where the probe shows exact int32 sums (VNNI), else 7-bit ones."""
        if not _fbgemm() or table.device.type != "cpu" or table.dtype != torch.float32:
            return None
        for reduce_range in (False, True):
            if accumulates_exactly(reduce_range, table.shape[1]):
                return cls(table, exact_from, q, scale, reduce_range)
        return None

    @property
    def row_limit(self) -> int:
        """The most rows :meth:`project` takes the ``row_linear`` kernel at (then fbgemm)."""
        return ROW_KERNEL_MAX_REDUCED if self.reduce_range else ROW_KERNEL_MAX

    @property
    def packed(self):
        """fbgemm's packed int8 table."""
        if self._packed is None:
            self._packed = _pack(self.q, self.scale)
        return self._packed

    def project(self, hidden: torch.Tensor) -> Screened:
        """The approximate logits of ``hidden`` (n, D) and their per-row bound terms."""
        h = hidden.detach().float().contiguous()
        fn = kernel("row_linear") if h.shape[0] <= self.row_limit and h.is_cpu else None
        if fn is not None:
            steps = np.empty(h.shape[0], np.float32)
            logits = fn(h, self.q, None, None, self.scale, steps)
            half, floor = float(steps.max()) * _ROW_HALF_STEP, float(np.finfo(np.float32).tiny)
        else:
            logits = torch.ops.quantized.linear_dynamic(h, self.packed, self.reduce_range)
            lo, hi = (float(v) for v in h.aminmax())
            half, floor = (max(hi, 0.0) - min(lo, 0.0)) / self.qmax * _HALF_STEP, _FBGEMM_MIN_HALF_STEP
        h_norm = torch.linalg.vector_norm(h, 1, dim=1).mul_(1 + 1e-6).add_(half * h.shape[1])
        return Screened(logits, h, half, h_norm, floor)

    def _radius(self, screened: Screened, cols: torch.Tensor | None = None) -> torch.Tensor:
        """The error bound (n, len(cols)) of the approximate text logits at ``cols`` (default: all)."""
        w_norm, w_err = (self.w_norm, self.w_err) if cols is None else (self.w_norm[cols], self.w_err[cols])
        return torch.addcmul(screened.half_step * w_norm, screened.h_norm[:, None], w_err)

    def resolve(self, screened: Screened, k: int, text_max: torch.Tensor | None = None) -> bool:
        """Make ``screened.logits`` exact wherever a decision can depend on it (see the module doc);
        masked (-inf) logits stay masked.  ``k``: how many of each row's largest logits are needed
        (``text_max``, rows that also need their largest text logit, is then covered: the threshold
        is the least lower bound among the k best approximate text logits).  Returns False, leaving
        the logits partly updated, when too many rows would need recomputing."""
        logits, h, cut = screened.logits, screened.hidden, self.exact_from
        if not screened.min_half_step <= screened.half_step < float("inf") or cut >= logits.shape[1]:
            return False  # a grid other than the one assumed (fbgemm widens a tiny range), an all-zero or non-finite row
        fn = kernel("screen_resolve_row") if k == 1 and logits.shape[0] == 1 else None
        if fn is not None and logits.is_contiguous() and h.is_contiguous() and logits.dtype == torch.float32:
            # one greedy row: the same candidates and values in two passes (oasr-kernels), not a dozen torch ops
            return fn(logits[0], h[0], self.table, self.w_norm, self.w_err, screened.half_step,
                      float(screened.h_norm[0]), self.w_norm_max, self.w_err_max, cut, MAX_EXACT, self._cols)
        tail = logits[:, cut:]
        tail.copy_(torch.where(torch.isinf(tail), tail, F.linear(h, self.table[cut:])))
        text = logits[:, :cut]
        # a threshold every decision's winner provably reaches: some k text logits' lower bounds
        best, where = text.topk(min(k, cut), dim=1) if k > 1 else text.max(dim=1, keepdim=True)
        at = torch.addcmul(screened.half_step * self.w_norm[where], screened.h_norm[:, None], self.w_err[where])
        threshold = (best - at).amin(dim=1)
        if k > 1 and bool((torch.isinf(threshold) & ~torch.isinf(best[:, 0])).any()):
            return False  # fewer than k text logits left unmasked: every one of them is needed
        threshold = torch.where(torch.isinf(threshold), float("inf"), threshold)  # all text masked: none
        # coarse: the largest radius of each row; then the candidates' own radii
        widest = screened.half_step * self.w_norm_max + screened.h_norm * self.w_err_max
        cols = (text >= (threshold - widest)[:, None]).any(dim=0).nonzero()[:, 0]
        if cols.numel() > 64:
            reach = text[:, cols] + self._radius(screened, cols)
            cols = cols[(reach >= threshold[:, None]).any(dim=0)]
        if cols.numel() > MAX_EXACT:
            return False
        if cols.numel():
            exact = F.linear(h, self.table.index_select(0, cols))
            if logits.shape[0] > 1:  # another row's candidate may be masked in this one
                current = text[:, cols]
                exact = torch.where(torch.isinf(current), current, exact)
            text[:, cols] = exact
        return True
