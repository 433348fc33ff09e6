"""The int8-screened vocabulary projection (oasr_models_hf.whisper.screen): its error bound holds on every
logit, its decisions are the fp32 product's (greedy with and without timestamp rules, openai-style beam
search), on the tiny random Whisper transformers builds and on the trained tiny.en, and it falls back to
the full product when too many logits would need recomputing.  The adversarial table shows that a bound
half as wide, or candidates left unrecomputed, decide wrongly."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from oasr.decoding.strategy import DecodeBatch
from oasr.engine.options import DecodingOptions
from oasr_models_hf.whisper import screen as screen_mod
from oasr_models_hf.whisper import search as search_mod
from oasr_models_hf.whisper.screen import VocabScreen, accumulates_exactly
from oasr_models_hf.whisper.search import WindowTask, search_windows


@pytest.fixture
def count_resolves(monkeypatch):
    """Records what each VocabScreen.resolve returned (True: screened, False: full product)."""
    seen: list[bool] = []
    original = VocabScreen.resolve

    def spy(self, screened, k, text_max=None):
        out = original(self, screened, k, text_max)
        seen.append(out)
        return out

    monkeypatch.setattr(VocabScreen, "resolve", spy)
    return seen


def _screen_of(model, eot: int) -> VocabScreen:
    decoder = copy.copy(model.decoder)
    decoder.screen_vocabulary = decoder.screen_int8_vocabulary = True
    decoder.screen_after_steps = 0
    screen = decoder.vocab_screen(eot)
    assert screen is not None, "no screen on this CPU (fbgemm missing or its int8 product saturates)"
    return screen


def _hidden_rows(dim: int, seed: int) -> list[torch.Tensor]:
    """Blocks of 1 and 4 rows at three scales, some with outlier channels (as final-norm outputs have)."""
    gen = torch.Generator().manual_seed(seed)
    blocks = []
    for scale in (0.05, 1.0, 8.0):
        for rows in (1, 4):
            for _ in range(4):
                h = torch.randn(rows, dim, generator=gen) * scale
                h[:, torch.randint(0, dim, (3,), generator=gen)] *= 12
                blocks.append(h)
    return blocks


def _assert_bound_holds(screen: VocabScreen) -> None:
    cut = screen.exact_from
    table64 = screen.table[:cut].double()
    worst = 0.0
    for h in _hidden_rows(screen.table.shape[1], seed=cut):
        screened = screen.project(h)
        radius = screen._radius(screened).double()
        approx = screened.logits[:, :cut].double()
        real = h.double() @ table64.t()
        fp32 = F.linear(h, screen.table[:cut]).double()
        for value in (real, fp32):
            err = (value - approx).abs()
            assert bool((err <= radius).all()), f"bound broken by {float((err - radius).max())}"
            worst = max(worst, float((err / radius).max()))
    assert worst > 0.01, "the bound never came near the actual error: the check compares nothing"


def test_bound_holds_on_every_logit_tiny_random(tiny):
    _assert_bound_holds(_screen_of(tiny.model, tiny.config.generation.eot_id))


def test_bound_holds_on_every_logit_tiny_en(tiny_en):
    loaded, _ = tiny_en
    _assert_bound_holds(_screen_of(loaded.model, loaded.model.config.generation.eot_id))


def test_fbgemm_int32_sums_are_exact_on_the_path_used(tiny):
    """The worst case for 16-bit pair sums (top-of-grid activations, +-127 weights) comes out exact with
    the activation range the screen chose (8 bits where VNNI sums in int32, else 7)."""
    screen = _screen_of(tiny.model, tiny.config.generation.eot_id)
    assert accumulates_exactly(screen.reduce_range, screen.table.shape[1])
    assert accumulates_exactly(True, screen.table.shape[1])  # 7-bit activations never saturate



def test_few_rows_take_the_row_kernel_with_its_own_grid(tiny_en, row_kernel_calls):
    """One or two rows: the ``row_linear`` kernel's int8 product, its bound built from the kernel's own 16-bit row
    grids (far tighter than fbgemm's 8-bit block grid), and it holds; more rows: fbgemm (8 rows where fbgemm keeps
    7-bit activations, no VNNI)."""
    loaded, _ = tiny_en
    screen = _screen_of(loaded.model, loaded.model.config.generation.eot_id)
    cut, dim = screen.exact_from, screen.table.shape[1]
    gen = torch.Generator().manual_seed(5)
    assert screen.row_limit == (screen_mod.ROW_KERNEL_MAX_REDUCED if screen.reduce_range else screen_mod.ROW_KERNEL_MAX)
    for rows in (1, screen.row_limit):
        h = torch.randn(rows, dim, generator=gen)
        h[:, :3] *= 20  # outlier channels: fbgemm's block grid is coarse on the others
        row_kernel_calls.clear()
        screened = screen.project(h)
        assert row_kernel_calls == [(rows, tuple(screen.q.shape), True)]
        fbgemm = screen_mod.Screened(torch.ops.quantized.linear_dynamic(h, screen.packed, screen.reduce_range), h,
                                     0.0, screened.h_norm)
        assert screened.half_step <= float(h.abs().amax()) / 2**14  # the 16-bit grid, not 8 bits of the range
        real = h.double() @ screen.table[:cut].double().t()
        err = (real - screened.logits[:, :cut].double()).abs()
        assert bool((err <= screen._radius(screened).double()).all())
        assert float(err.max()) < float((real - fbgemm.logits[:, :cut].double()).abs().max())
        # random rows have flat distributions: resolved two at a time (eight at once recompute too many candidates)
        for first in range(0, rows, 2):
            part = screened.take(list(range(first, min(rows, first + 2))))
            assert screen.resolve(part, 1)
            assert torch.equal(part.logits[:, :cut].argmax(1), real[first:first + 2].argmax(1))
    row_kernel_calls.clear()
    screen.project(torch.randn(screen.row_limit + 1, dim))
    assert row_kernel_calls == []

def _adversarial(dim: int = 64, text: int = 32, tail: int = 4):
    """A table whose row 0 rounds to int8 0.49 steps short on every entry, all against ``h``, so the
    int8 product ranks row 1 (on the grid, truly a little lower) above it; the other rows are far lower."""
    gen = torch.Generator().manual_seed(0)
    step = 0.01
    sign = torch.where(torch.arange(dim) % 3 == 0, -1.0, 1.0)
    sign[0] = 1.0
    q = torch.randint(-3, 4, (text + tail, dim), generator=gen).float()
    q[:, 0] = 127.0  # every row's int8 scale is ``step``
    table = q * step
    table[0, 1:] = 3.49 * step * sign[1:]  # int8: 3 steps, 0.49 short of the truth on each entry
    table[1, 1:] = 3.0 * step * sign[1:]  # on the grid ...
    table[1, 1] += 25 * step * sign[1]  # ... and above row 0's int8 value, below its true value
    h = sign[None, :].clone()
    exact = (h.double() @ table.double().t())[0]
    return table, h, exact, text


def test_adversarial_table_decides_exactly_and_the_bound_is_needed(monkeypatch):
    table, h, exact, cut = _adversarial()
    screen = VocabScreen.build(table, cut)
    assert screen is not None
    truth = int(exact[:cut].argmax())
    approx = screen.project(h).logits
    assert int(approx[0, :cut].argmax()) != truth, "the int8 product already ranks right: nothing is tested"

    def decide(s: VocabScreen) -> int:
        screened = s.project(h)
        assert s.resolve(screened, 1, torch.tensor([True]))
        return int(screened.logits[0, :cut].argmax())

    assert decide(screen) == truth
    # a bound half as wide misses the true winner
    halved = copy.copy(screen)
    halved.w_norm, halved.w_err = screen.w_norm / 2, screen.w_err / 2
    halved.w_norm_max, halved.w_err_max = screen.w_norm_max / 2, screen.w_err_max / 2
    assert decide(halved) != truth
    # candidates left at their int8 values (the "recomputation" reads the int8 table) decide wrongly
    lazy = copy.copy(screen)
    lazy.table = (torch.clamp(torch.round(table / (table.abs().amax(1, keepdim=True) / 127)), -127, 127)
                  * (table.abs().amax(1, keepdim=True) / 127))
    assert decide(lazy) != truth


def _tasks(prompt, timestamps, n, beam=None, max_new=40):
    return [WindowTask(prompt=prompt, sot_index=0, timestamps=timestamps, beam_size=beam, max_new_tokens=max_new)
            for _ in range(n)]


def _search_both(model, cross, tasks, gen):
    decoder = copy.copy(model.decoder)
    decoder.screen_vocabulary = decoder.screen_beam_vocabulary = False
    plain = search_windows(decoder, cross[0], cross[1], tasks, gen)
    screened_decoder = copy.copy(decoder)
    screened_decoder.screen_vocabulary = screened_decoder.screen_beam_vocabulary = True
    screened_decoder.screen_after_steps = 0
    screened = search_windows(screened_decoder, cross[0], cross[1], tasks, gen)
    return plain, screened


def test_screen_is_on_by_default_and_screens_greedy_only(tiny, monkeypatch, count_resolves):
    """The fp32 decoder screens its greedy steps by default once it has decoded ``screen_after_steps`` without the
    screen (so one short clip never builds it); False on the instance turns it off; the beam search and an int8
    projection screen only when asked."""
    decoder = copy.copy(tiny.model.decoder)
    decoder.plain_steps = 0
    assert type(decoder).screen_vocabulary is True
    assert type(decoder).screen_beam_vocabulary is False
    assert type(decoder).screen_int8_vocabulary is False
    gen = tiny.config.generation
    assert decoder.vocab_screen(gen.eot_id) is None, "no screen before any step"
    torch.manual_seed(3)
    with torch.no_grad():
        cross = decoder.cross_kv(tiny.model.encode_offline(torch.randn(1, 3000, 80))[0])
        long_task = _tasks([gen.sot_id, 50259, gen.transcribe_id], False, 1, max_new=decoder.screen_after_steps)[0]
        long_task.suppress = (*gen.suppress_tokens, gen.eot_id)  # runs its whole length
        search_windows(decoder, cross[0], cross[1], [long_task], gen)
        assert not count_resolves, "the first steps take the full product"
        assert decoder.vocab_screen(gen.eot_id) is not None
        tasks = _tasks([gen.sot_id, 50259, gen.transcribe_id], True, 1, max_new=10)
        search_windows(decoder, cross[0], cross[1], tasks, gen)
        assert count_resolves, "a default greedy search screened its steps"
        count_resolves.clear()
        search_windows(decoder, cross[0], cross[1], _tasks(tasks[0].prompt, True, 1, beam=2, max_new=10), gen)
        assert not count_resolves, "the beam search does not screen by default"
        monkeypatch.setattr(decoder, "screen_vocabulary", False)
        assert decoder.vocab_screen(gen.eot_id) is None
        search_windows(decoder, cross[0], cross[1], tasks, gen)
    assert not count_resolves


@pytest.fixture
def normalizer_gaps(monkeypatch):
    """Per window: how far the screened rows' own (approximate) log-softmax would put its sum_logprob
    from the exact one (the fp32 product of the same hidden states under the same masks)."""
    gaps: dict[int, float] = {}
    original = search_mod._DeferredLogprobs.add

    def spy(self, owners, hidden, filtered, tokens):
        approx = F.log_softmax(filtered, dim=-1).gather(1, tokens[:, None])[:, 0]
        full = F.linear(hidden.double(), self.decoder.embed_tokens.weight.double())
        exact = F.log_softmax(full.masked_fill(torch.isinf(filtered), float("-inf")), dim=-1)
        diff = (approx.double() - exact.gather(1, tokens[:, None])[:, 0]).tolist()
        for i, d in zip(owners, diff, strict=True):
            gaps[i] = gaps.get(i, 0.0) + d
        original(self, owners, hidden, filtered, tokens)

    monkeypatch.setattr(search_mod._DeferredLogprobs, "add", spy)
    return gaps


def _assert_exact_logprobs(plain, screened, gaps, min_gap):
    """Screened greedy results carry the plain path's sum_logprob / avg_logprob within float noise,
    where the screened rows' own normalizer puts some window's avg_logprob more than ``min_gap`` off."""
    assert [r.tokens for r in screened] == [r.tokens for r in plain]
    assert gaps, "no step was screened: nothing is compared"
    for got, ref in zip(screened, plain, strict=True):
        assert got.avg_logprob == pytest.approx(ref.avg_logprob, abs=1e-5)
        assert got.sum_logprob == pytest.approx(ref.sum_logprob, abs=1e-5 * (len(ref.tokens) + 1))
    worst = max(abs(gaps[i]) / (len(plain[i].tokens) + 1) for i in gaps)
    assert worst > min_gap, f"the approximate normalizer is as close ({worst:.2e}): the check has no teeth"


def _tiny_chirp_window(tiny, chirp_features, timestamps):
    """The tiny random model, its generation config, an English transcribe prompt (with or without timestamp
    tokens) and the cross-attention K/V of the chirp clips' windows."""
    model, gen = tiny.model, tiny.config.generation
    prompt = [gen.sot_id, 50259, gen.transcribe_id] + ([] if timestamps else [gen.no_timestamps_id])
    with torch.no_grad():
        enc, _ = model.encode_offline(chirp_features.transpose(1, 2))
        return model, gen, prompt, model.decoder.cross_kv(enc)


@pytest.mark.parametrize("timestamps", [True, False])
def test_tiny_random_screened_greedy_logprobs_are_exact(tiny, chirp_features, normalizer_gaps, timestamps):
    model, gen, prompt, cross = _tiny_chirp_window(tiny, chirp_features, timestamps)
    with torch.no_grad():
        plain, screened = _search_both(model, cross, _tasks(prompt, timestamps, cross[0][0].shape[0]), gen)
    assert sum(len(r.tokens) for r in plain) >= 20 * len(plain)
    _assert_exact_logprobs(plain, screened, normalizer_gaps, 1e-5)


@pytest.mark.parametrize("timestamps", [True, False])
def test_tiny_random_screened_greedy_equals_plain(tiny, chirp_features, count_resolves, timestamps):
    model, gen, prompt, cross = _tiny_chirp_window(tiny, chirp_features, timestamps)
    with torch.no_grad():
        for rows in (slice(0, 1), slice(0, 6)):  # one row (a matrix-vector product) and a batch
            part = ([k[rows] for k in cross[0]], [v[rows] for v in cross[1]])
            tasks = _tasks(prompt, timestamps, part[0][0].shape[0])
            plain, screened = _search_both(model, part, tasks, gen)
            assert [r.tokens for r in screened] == [r.tokens for r in plain]
            assert sum(len(r.tokens) for r in plain) >= 20 * len(plain)
    assert count_resolves.count(True) >= 20, f"the screen decided only {count_resolves.count(True)} steps"


@pytest.mark.parametrize("timestamps", [True, False])
def test_tiny_en_screened_greedy_logprobs_are_exact(tiny_en_strategy, beckett, sample_wav, normalizer_gaps,
                                                    timestamps, monkeypatch):
    # two rows would take the row kernel, whose 16-bit product puts the normalizer only ~5e-6 per token off: under
    # this check's float tolerance, so the teeth come from fbgemm's 8-bit product (the deferred exact product does
    # not depend on which int8 product screened)
    monkeypatch.setattr(screen_mod, "ROW_KERNEL_MAX", 0)
    monkeypatch.setattr(screen_mod, "ROW_KERNEL_MAX_REDUCED", 0)
    strategy = tiny_en_strategy
    model, gen = strategy.ctx.model, strategy.gen
    prompt = [gen.sot_id] + ([] if timestamps else [gen.no_timestamps_id])
    with torch.inference_mode():
        mels = [strategy.log_mels([torch.from_numpy(clip)])[0][:, : model.config.input_frames] for clip in
                (beckett, sample_wav)]
        width = max(m.shape[1] for m in mels)
        mel = torch.stack([F.pad(m, (0, width - m.shape[1])) for m in mels]).transpose(1, 2)
        cross = model.decoder.cross_kv(model.encoder(mel))
        plain, screened = _search_both(model, cross, _tasks(prompt, timestamps, 2, max_new=224), gen)
    assert sum(len(r.tokens) for r in plain) >= 40
    _assert_exact_logprobs(plain, screened, normalizer_gaps, 1e-5)


def _decode(strategy, clips, options, screened: bool, monkeypatch):
    decoder = strategy.ctx.model.decoder
    monkeypatch.setattr(decoder, "screen_vocabulary", screened, raising=False)
    monkeypatch.setattr(decoder, "screen_after_steps", 0, raising=False)
    monkeypatch.setattr(decoder, "screen_beam_vocabulary", screened, raising=False)
    out = []
    for clip in clips:
        batch = DecodeBatch(request_ids=["0"], options=[options], waveforms=[torch.from_numpy(clip)])
        out.append(strategy.decode(batch)[0])
    return out


@pytest.mark.parametrize("options", [DecodingOptions(temperature=0.0),
                                     DecodingOptions(temperature=0.0, without_timestamps=True),
                                     DecodingOptions(temperature=0.0, beam_size=5)],
                         ids=["greedy-timestamps", "greedy", "beam5"])
def test_tiny_en_screened_tokens_equal_plain(tiny_en_strategy, beckett, sample_wav, count_resolves, monkeypatch,
                                             options):
    clips = [beckett, sample_wav]
    plain = _decode(tiny_en_strategy, clips, options, False, monkeypatch)
    assert not count_resolves
    screened = _decode(tiny_en_strategy, clips, options, True, monkeypatch)
    assert [o.tokens for o in screened] == [o.tokens for o in plain]
    assert sum(len(o.tokens) for o in plain) >= 90
    assert count_resolves.count(True) >= 20, f"the screen decided only {count_resolves.count(True)} steps"
    if options.beam_size is None:  # greedy: the full product is the exception
        assert count_resolves.count(True) >= 0.9 * len(count_resolves)


def test_fallback_to_the_full_product(tiny_en_strategy, beckett, count_resolves, monkeypatch):
    """With no room for recomputed rows every step takes the full product, and the tokens stay the same."""
    options = DecodingOptions(temperature=0.0)
    plain = _decode(tiny_en_strategy, [beckett], options, False, monkeypatch)
    monkeypatch.setattr(screen_mod, "MAX_EXACT", -1)  # even a step with no candidate falls back
    fallen = _decode(tiny_en_strategy, [beckett], options, True, monkeypatch)
    assert fallen[0].tokens == plain[0].tokens
    assert count_resolves and not any(count_resolves)


def test_resolve_refuses_a_degenerate_row(tiny):
    """An all-zero hidden row (fbgemm then picks its own grid) and a row whose k best are masked
    fall back instead of guessing."""
    screen = _screen_of(tiny.model, tiny.config.generation.eot_id)
    dim = screen.table.shape[1]
    assert not screen.resolve(screen.project(torch.zeros(1, dim)), 1)
    screened = screen.project(torch.randn(1, dim))
    screened.logits[0, 3:screen.exact_from] = float("-inf")
    assert not screen.resolve(screened, 6)


def test_int8_model_screen_decides_on_the_fp32_table(tiny_en):
    """With the int8 model's own output projection as the screen, the resolved argmax and top-6 are
    those of the fp32 embedding table, which the int8 product alone misses on some rows."""
    from oasr.layers.quant import quantize_model_int8

    loaded, _ = tiny_en
    model = copy.deepcopy(loaded.model)
    quantize_model_int8(model)
    eot = model.config.generation.eot_id
    screen = _screen_of(model, eot)
    table = loaded.model.decoder.embed_tokens.weight
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(64, table.shape[1], generator=gen) * 8
    int8_wrong = 0
    for h in hidden.split(1):
        exact = F.linear(h, table)
        screened = screen.project(h)
        int8_wrong += int(screened.logits.argmax()) != int(exact.argmax())
        if screen.resolve(screened, 6):
            assert torch.equal(screened.logits.topk(6).indices, exact.topk(6).indices)
            assert torch.allclose(screened.logits.topk(6).values, exact.topk(6).values, atol=1e-4)
    assert int8_wrong >= 1, "the int8 product ranks every row right: nothing is tested"


def _resolve_both(screen: VocabScreen, h: torch.Tensor, mask: torch.Tensor, monkeypatch):
    """One row resolved by the ``screen_resolve_row`` kernel and by the torch ops (the slot empty): results and the
    logits each leaves, from the same screened and masked row."""
    from oasr.layers import _backend

    out = []
    for slot in ("kernel", None):
        screened = screen.project(h)
        screened.logits.masked_fill_(mask, float("-inf"))
        with monkeypatch.context() as m:
            if slot is None:
                m.setitem(_backend._cache, "screen_resolve_row", None)
            else:
                assert _backend.kernel("screen_resolve_row") is not None, "oasr-kernels' resolve is registered"
            out.append((screen.resolve(screened, 1, torch.tensor([True])), screened.logits.clone()))
    return out


def test_one_row_resolve_kernel_equals_the_torch_path(tiny_en, monkeypatch):
    """On tiny.en's table: the same return value, the same logits made exact (to float rounding of the dot
    products) and the rest untouched, over rows at three scales with random masks, a row whose text is all masked,
    and the fallback when more rows than ``MAX_EXACT`` would need recomputing."""
    loaded, _ = tiny_en
    eot = loaded.model.config.generation.eot_id
    screen = _screen_of(loaded.model, eot)
    gen = torch.Generator().manual_seed(11)
    vocab = screen.table.shape[0]
    recomputed = []
    for h in _hidden_rows(screen.table.shape[1], seed=3):
        h = h[:1]
        mask = torch.rand(1, vocab, generator=gen) < 0.3
        (got_ok, got), (ref_ok, ref) = _resolve_both(screen, h, mask, monkeypatch)
        approx = screen.project(h).logits.masked_fill_(mask, float("-inf"))
        assert got_ok == ref_ok
        assert torch.equal(torch.isinf(got), torch.isinf(ref))
        assert torch.equal(got != approx, ref != approx)  # the same logits rewritten
        finite = ~torch.isinf(ref)
        scale = float(ref[finite].abs().max())
        assert float((got - ref)[finite].abs().max()) <= 1e-5 * scale
        if got_ok:
            assert int(got[0, :eot].argmax()) == int(ref[0, :eot].argmax())
            recomputed.append(int(((ref != approx) & finite)[0, :eot].sum()))
    assert max(recomputed) > 0, "no text logit was recomputed: the candidates were never compared"
    text_masked = torch.zeros(1, vocab, dtype=torch.bool)
    text_masked[0, :eot] = True
    h = _hidden_rows(screen.table.shape[1], seed=4)[0][:1]
    (got_ok, got), (ref_ok, ref) = _resolve_both(screen, h, text_masked, monkeypatch)
    assert got_ok and ref_ok and torch.allclose(got, ref, rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(screen_mod, "MAX_EXACT", 0)
    flat = _hidden_rows(screen.table.shape[1], seed=5)[0][:1] * 1e-3  # a flat row: many candidates
    (got_ok, _), (ref_ok, _) = _resolve_both(screen, flat, torch.zeros(1, vocab, dtype=torch.bool), monkeypatch)
    assert got_ok is False and ref_ok is False


def test_table_terms_kernel_equals_the_torch_passes(tiny_en, monkeypatch):
    """The screen's int8 copy and bound terms from oasr-kernels' one pass (``screen_table_terms``) are the torch
    passes': the same int8 values and scales, bit for bit (an all-zero row, rows whose entries sit half a step off
    the grid, and tiny.en's table), and the same bound terms to float64 summation order."""
    from oasr.layers import _backend

    loaded, _ = tiny_en
    table = loaded.model.decoder.embed_tokens.weight.detach().float()[:6000].clone()
    table[3] = 0.0  # scale 1, q 0
    table[4] = torch.arange(384, dtype=torch.float32) - 191.5  # amax 191.5: every entry lands near a half step
    table[5, :] = 0.5 * 127 / 200  # a constant row: w / scale = 127 exactly
    assert _backend.kernel("screen_table_terms") is not None, "oasr-kernels' table pass is registered"
    fast = VocabScreen(table, 5000)
    with monkeypatch.context() as m:
        m.setitem(_backend._cache, "screen_table_terms", None)
        slow = VocabScreen(table, 5000)
    w = table
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    q = torch.clamp(torch.round(w / scale[:, None]), -127, 127).to(torch.int8)
    from oasr_kernels.screen import screen_table_terms

    got_q, got_scale, got_norm, got_err = screen_table_terms(w.contiguous(), 5000, 1 + 1e-6)
    assert torch.equal(got_q, q) and torch.equal(got_scale, scale)
    torch.testing.assert_close(fast.w_norm, slow.w_norm, rtol=1e-6, atol=0)
    torch.testing.assert_close(fast.w_err, slow.w_err, rtol=1e-6, atol=0)
    assert fast.w_norm.shape == (5000,) and float(fast.w_err.max()) > 0
    h = torch.randn(2, 384)
    assert torch.equal(fast.project(h).logits, slow.project(h).logits)  # the same packed int8 table
