"""The fused decoder step (oasr-kernels' ``decoder_layer_rows``: one call per layer at up to ``rows.MAX_ROWS`` rows)
against the op-by-op step it replaces: the same logits and the same key/value caches over rows of different lengths,
beam rows sharing an encoder entry and merged states; and where it must not run (int8 step linears, autograd, more
rows, ``OASR_KERNELS=0``, a weight changed in place: the next step follows it); the int8 model's bfloat16 reads of
its step linears (``read_bf16``) against the op-by-op step over the same weights rounded to bfloat16."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from oasr.layers import _backend, rows

PROMPTS = [[50258, 50259, 50359, 50363, 100, 2000], [50258, 50259, 50359, 50363, 5, 60, 700, 8000, 11], [50258, 50359]]
STEPS = [[7, 300, 5000, 12, 50, 1000], [8, 9, 10, 11, 12, 13], [400, 401, 402, 403, 404, 405]]


@pytest.fixture(scope="module")
def enc(tiny):
    torch.manual_seed(5)
    with torch.no_grad():
        return tiny.model.encode_offline(torch.randn(3, 3000, 80))[0]


def _prompts(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in PROMPTS[:n])
    tokens = torch.tensor([p + [50257] * (width - len(p)) for p in PROMPTS[:n]])
    return tokens, torch.tensor([len(p) for p in PROMPTS[:n]])


def _run(decoder, enc, n: int, *, beam: int = 1, merged: bool = False, after_prefill=None):
    """Logits of every step and the final state, prompts of different lengths (right-padded); ``beam``: each row
    repeated (rows sharing their encoder entry); ``merged``: the rows prefilled as two states then merged;
    ``after_prefill(state)`` runs between the prefill and the steps."""
    tokens, lengths = _prompts(n)
    if merged:
        a, _ = decoder.prefill(enc[:1], tokens[:1, :lengths[0]])
        b, _ = decoder.prefill(enc[1:n], tokens[1:n], lengths[1:n])
        state = decoder.merge(a, b)
    else:
        state, _ = decoder.prefill(enc[:n], tokens, lengths)
    if beam > 1:
        state = decoder.select(state, torch.arange(n).repeat_interleave(beam))
    if after_prefill is not None:
        after_prefill(state)
    out = []
    for j in range(len(STEPS[0])):
        feed = torch.tensor([STEPS[r][j] for r in range(n)]).repeat_interleave(beam)
        out.append(decoder.step(state, feed))
    return torch.stack(out, 1), state


def _both(decoder, enc, monkeypatch, fused_step_calls, **kwargs):
    with torch.no_grad():
        fused, fused_state = _run(decoder, enc, **kwargs)
        assert fused_step_calls, "the fused kernel ran"
        with monkeypatch.context() as m:
            m.setitem(_backend._cache, "decoder_layer_rows", None)
            ops, ops_state = _run(decoder, enc, **kwargs)
    return fused, fused_state, ops, ops_state


def _close(got: torch.Tensor, ref: torch.Tensor, rel: float = 2e-5) -> None:
    assert (got - ref).abs().max() <= rel * ref.abs().max(), (got - ref).abs().max()


@pytest.mark.parametrize("case", [dict(n=1), dict(n=3), dict(n=2, beam=2), dict(n=2, merged=True)],
                         ids=["one row", "three lengths", "beam rows", "merged states"])
def test_fused_step_equals_the_op_by_op_step(tiny, enc, monkeypatch, fused_step_calls, case):
    """Same logits and caches at float rounding; each step is one kernel call per layer."""
    decoder = tiny.model.decoder
    fused, fused_state, ops, ops_state = _both(decoder, enc, monkeypatch, fused_step_calls, **case)
    rows_per_step = case["n"] * case.get("beam", 1)
    assert fused_step_calls == [rows_per_step] * (len(STEPS[0]) * len(decoder.layers))
    _close(fused, ops)
    assert torch.equal(fused.argmax(-1), ops.argmax(-1))
    assert torch.equal(fused_state.lengths, ops_state.lengths)
    for got, ref in zip(fused_state.self_k + fused_state.self_v, ops_state.self_k + ops_state.self_v, strict=True):
        _close(got, ref)  # the written positions, and zeros beyond each row's length
        assert torch.equal(got == 0, ref == 0)


def test_fused_step_is_not_taken_where_it_does_not_apply(tiny, enc, monkeypatch, fused_step_calls):
    decoder = tiny.model.decoder
    tokens, lengths = _prompts(1)

    def step(model_decoder, n_rows: int = 1, grad: bool = False) -> None:
        with torch.set_grad_enabled(grad):
            state, _ = model_decoder.prefill(enc[:1], tokens, lengths,
                                             rows=torch.zeros(n_rows, dtype=torch.long)) if n_rows > 1 else \
                model_decoder.prefill(enc[:1], tokens, lengths)
            model_decoder.step(state, torch.full((n_rows,), 7))

    step(decoder)
    assert fused_step_calls == [1] * len(decoder.layers)
    fused_step_calls.clear()
    step(decoder, grad=True)  # autograd: the op-by-op path
    assert fused_step_calls == []
    with torch.no_grad():
        tokens_wide = tokens.repeat(rows.MAX_ROWS + 1, 1)
        state, _ = decoder.prefill(enc[:1], tokens_wide, lengths.repeat(rows.MAX_ROWS + 1),
                                   rows=torch.zeros(rows.MAX_ROWS + 1, dtype=torch.long))
        decoder.step(state, torch.full((rows.MAX_ROWS + 1,), 7))
    assert fused_step_calls == []  # more rows than the kernel takes
    from oasr.layers.quant import quantize_model_int8

    model = copy.deepcopy(tiny.model)
    quantize_model_int8(model, model.quantization_layout())
    assert all(lin._int8 is None for lin in model.decoder._step_linears(model.decoder.layers[0])), \
        "the shipped layout keeps the step linears float32: the int8 model takes the fused step"
    with torch.no_grad():
        step(model.decoder)
    assert fused_step_calls == [1] * len(decoder.layers)
    fused_step_calls.clear()
    quantize_model_int8(model.decoder.layers[1], None)  # a layer whose step linears are int8
    with torch.no_grad():
        step(model.decoder)
    assert fused_step_calls == []
    monkeypatch.setenv("OASR_KERNELS", "0")
    with torch.no_grad():
        step(decoder)
    assert fused_step_calls == []


def test_fused_step_follows_a_weight_changed_in_place(tiny, enc, monkeypatch, fused_step_calls):
    model = copy.deepcopy(tiny.model)
    decoder = model.decoder
    with torch.no_grad():
        _both(decoder, enc, monkeypatch, fused_step_calls, n=1)  # builds the kernel's arrays
        for lin in (decoder.layers[0].fc2, decoder.layers[1].encoder_attn.q_proj):
            lin.weight.mul_(1.5)
        decoder.layers[0].self_attn_layer_norm.bias.add_(0.25)
        fused, _, ops, _ = _both(decoder, enc, monkeypatch, fused_step_calls, n=1)
        before, _, _, _ = _both(tiny.model.decoder, enc, monkeypatch, fused_step_calls, n=1)
    _close(fused, ops)
    assert (fused - before).abs().max() > 1e-2  # the change reached the kernel


def test_int8_model_reads_its_marked_step_linears_at_bfloat16(tiny, enc, monkeypatch, fused_step_calls,
                                                           row_kernel_calls):
    """The int8 layout marks the self-attention and MLP step linears ``read_bf16``: the fused step equals the
    op-by-op step of the same model with those weights rounded to bfloat16 after the prefill (which reads them at
    float32, as the fused run's prefill does), and not the unrounded one's as closely; its one-row vocabulary
    projection is the row kernel's weight-only int8 product."""
    from oasr.layers.quant import quantize_model_int8

    model = copy.deepcopy(tiny.model)
    section = quantize_model_int8(model, model.quantization_layout())
    decoder = model.decoder
    decoder.int8_vocab_row_kernel = True  # on every CPU (an AMX one takes fbgemm's one-row GEMM: the test below)
    decoder.cross_fp16 = False  # the cross-attention read at float32 here (float16: the test below)
    marked = {lin for layer in decoder.layers for lin in decoder._step_linears(layer) if lin.read_bf16}
    cross = {lin for layer in decoder.layers for lin in (layer.encoder_attn.q_proj, layer.encoder_attn.out_proj)}
    assert len(marked) == 6 * len(decoder.layers) and not marked & cross
    assert len(section["read_bf16"]) == len(marked)

    def round_marked(state) -> None:
        for lin in marked:
            lin.weight.copy_(lin.weight.to(torch.bfloat16).float())

    with torch.no_grad():
        _run(decoder, enc, 1)
        assert (1, tuple(decoder.proj_out.weight.shape), True) in row_kernel_calls
        # compared through the dequantized vocabulary at float32: the int8 row kernel rounds each row to a 16-bit
        # grid, where the runs' float noise in the hidden state flips a step now and then (5e-4 against 1e-4 of the
        # largest logit, measured on an AVX2 core)
        table = decoder.proj_out.weight.float() * decoder.proj_out.weight_scale[:, None]
        monkeypatch.setattr(decoder, "logits", lambda hidden: F.linear(hidden, table))
        fused_step_calls.clear()
        fused, _ = _run(decoder, enc, 2)
        assert fused_step_calls == [2] * (len(STEPS[0]) * len(decoder.layers))
        monkeypatch.setitem(_backend._cache, "decoder_layer_rows", None)
        plain, _ = _run(decoder, enc, 2)
        rounded, _ = _run(decoder, enc, 2, after_prefill=round_marked)
    _close(fused, rounded)
    assert (fused - rounded).abs().max() * 10 < (fused - plain).abs().max()


def test_pinned_weights_resolve_the_fused_arrays_once(tiny, enc, monkeypatch, fused_step_calls):
    """Inside ``pinned_weights`` (a search) the kernel's arrays are resolved once for all steps, with the same logits;
    outside it every step checks them against the weights (so an in-place change is followed, test above)."""
    model = copy.deepcopy(tiny.model)
    decoder = model.decoder
    resolved = []
    resolve = type(decoder)._resolve_fused_weights

    def counting(self, fn):
        resolved.append(fn)
        return resolve(self, fn)

    monkeypatch.setattr(type(decoder), "_resolve_fused_weights", counting)
    with torch.no_grad():
        plain, _ = _run(decoder, enc, 2)
        assert len(resolved) == len(STEPS[0])
        resolved.clear()
        with decoder.pinned_weights():
            with decoder.pinned_weights():  # nested: the outer block's arrays
                pinned, _ = _run(decoder, enc, 2)
            again, _ = _run(decoder, enc, 2)
        assert len(resolved) == 1
        assert torch.equal(pinned, plain) and torch.equal(again, plain)
        resolved.clear()
        _run(decoder, enc, 1)  # the block is over: resolved (checked) per step again
    assert len(resolved) == len(STEPS[0])
    assert fused_step_calls, "the fused kernel ran"


@pytest.mark.parametrize("amx", [False, True], ids=["no AMX", "AMX"])
def test_int8_vocabulary_one_row_kernel_by_cpu(tiny, enc, monkeypatch, row_kernel_calls, amx):
    """``int8_vocab_row_kernel`` None: an int8 vocabulary's one-row projection takes the row kernel without AMX and
    fbgemm's one-row GEMM with it; both are the int8 product within its activations' rounding, and the top logits
    are rescored exactly either way (the greedy tokens are the same)."""
    from oasr.layers.quant import quantize_model_int8
    from oasr_models_hf.whisper import model as whisper_model

    model = copy.deepcopy(tiny.model)
    quantize_model_int8(model, model.quantization_layout())
    decoder = model.decoder
    assert decoder.int8_vocab_row_kernel is None
    vocab_shape = (1, tuple(decoder.proj_out.weight.shape), True)
    with torch.no_grad():
        monkeypatch.setattr(whisper_model, "amx", lambda: amx)
        chosen, _ = _run(decoder, enc, 1)
        assert (vocab_shape in row_kernel_calls) is not amx
        row_kernel_calls.clear()
        decoder.int8_vocab_row_kernel = amx  # the other one
        other, _ = _run(decoder, enc, 1)
        assert (vocab_shape in row_kernel_calls) is amx
    assert torch.equal(chosen.argmax(-1), other.argmax(-1))
    # fbgemm's one-row grid is the row's own 8-bit one: the two differ by its rounding, a small part of the logits
    assert 0 < (chosen - other).abs().max() <= 0.02 * chosen.abs().max()


@pytest.mark.parametrize("case", [dict(n=1), dict(n=2, beam=2), dict(n=2, merged=True)],
                         ids=["one row", "beam rows", "merged states"])
def test_int8_model_reads_the_cross_attention_at_float16(tiny, enc, monkeypatch, fused_step_calls, case):
    """``cross_fp16`` (on by default) in the int8 layout: the fused step reads the cross-attention keys and values as
    float16 copies, made at the state's first fused step and carried through ``select`` and ``merge``, and the
    cross-attention q/out weights (float32 in the layout) as float16.  Its logits equal float32 reads of the same
    keys, values and weights rounded to float16, and not the unrounded ones as closely."""
    from oasr.layers.quant import quantize_model_int8

    model = copy.deepcopy(tiny.model)
    quantize_model_int8(model, model.quantization_layout())
    decoder = model.decoder
    assert decoder.cross_fp16
    cross_linears = [lin for layer in decoder.layers for lin in (layer.encoder_attn.q_proj, layer.encoder_attn.out_proj)]
    assert not any(lin.read_bf16 or lin._int8 is not None for lin in cross_linears)  # float32 in the layout
    # compared through the dequantized vocabulary at float32 (see the test above)
    table = decoder.proj_out.weight.float() * decoder.proj_out.weight_scale[:, None]
    monkeypatch.setattr(decoder, "logits", lambda hidden: F.linear(hidden, table))

    def round_cross(state) -> None:
        assert state.cross_k_read is None  # no fused step yet
        for t in (*state.cross_k, *state.cross_v, *(lin.weight for lin in cross_linears)):
            t.copy_(t.to(torch.float16).float())

    with torch.no_grad():
        half, state = _run(decoder, enc, **case)
        steps = len(STEPS[0]) * len(decoder.layers)
        assert fused_step_calls == [case["n"] * case.get("beam", 1)] * steps
        read = (*state.cross_k_read, *state.cross_v_read)
        assert [k.dtype for k in read] == [torch.float16] * 2 * len(decoder.layers)
        assert [k.shape for k in read] == [k.shape for k in (*state.cross_k, *state.cross_v)]
        decoder.cross_fp16 = False
        plain, plain_state = _run(decoder, enc, **case)
        assert plain_state.cross_k_read is None
        rounded, _ = _run(decoder, enc, **case, after_prefill=round_cross)
    _close(half, rounded)
    assert (half - rounded).abs().max() * 10 < (half - plain).abs().max()


def test_select_and_merge_carry_the_float16_cross_kv(tiny, enc):
    """A state's float16 cross-attention copies follow ``select`` (entries no row reads are dropped) and ``merge``
    (concatenated when both states have them; otherwise made again at the next fused step)."""
    from oasr.layers.quant import quantize_model_int8

    model = copy.deepcopy(tiny.model)
    quantize_model_int8(model, model.quantization_layout())
    decoder = model.decoder
    tokens, lengths = _prompts(3)

    def copies_match(state) -> None:
        pairs = zip((*state.cross_k, *state.cross_v), (*state.cross_k_read, *state.cross_v_read), strict=True)
        assert all(torch.equal(h, f.to(torch.float16)) for f, h in pairs)

    with torch.no_grad():
        state, _ = decoder.prefill(enc[:3], tokens, lengths)
        decoder.step(state, torch.tensor([7, 8, 9]))
        copies_match(state)
        kept = decoder.select(state, torch.tensor([2, 0]))
        assert kept.cross_k_read[0].shape[0] == 2  # entry 1 dropped
        copies_match(kept)
        other, _ = decoder.prefill(enc[:1], tokens[:1, :lengths[0]])
        assert decoder.merge(kept, other).cross_k_read is None  # ``other`` has none yet
        decoder.step(other, torch.tensor([5]))
        merged = decoder.merge(kept, other)
        assert merged.cross_k_read[0].shape[0] == 3
        copies_match(merged)


def test_cross_kv_beyond_float16_keep_float32_reads(tiny, enc):
    """A state whose cross-attention values overflow float16 keeps float32 reads (the copies are the float32 caches)."""
    from oasr.layers.quant import quantize_model_int8

    model = copy.deepcopy(tiny.model)
    quantize_model_int8(model, model.quantization_layout())
    decoder = model.decoder
    with torch.no_grad():
        state, _ = decoder.prefill(enc[:1], torch.tensor([PROMPTS[0]]))
        state.cross_v[0][0, 0, 0, 0] = 1e6
        decoder.step(state, torch.tensor([7]))
    assert all(r is c for r, c in zip((*state.cross_k_read, *state.cross_v_read), (*state.cross_k, *state.cross_v),
                                      strict=True))
