"""The TDT greedy search alone: OASR's ``transducer_greedy_search`` vs sherpa-onnx's loop on NeMo's ONNX export.

Both searches read the same encoder output (OASR's, one clip per call) of a Parakeet-TDT-size random NeMo
model (``benchmarks/fastconformer.py`` builds it; ``--work`` is that run's ``--work`` folder).  The
sherpa-onnx side is its offline greedy TDT decoder re-enacted in Python over onnxruntime (one thread):
``decoder.onnx`` run once on the blank and once per emitted label, ``joiner.onnx`` once per decision on the
raw encoder frame (the export's joint projects the frame itself), argmax of the token and duration logits.
Printed: the predictor (decoder) and joint calls of both per clip set, the tokens' agreement, the process CPU
time of both searches (the ONNX loop's Python overhead is included in its time: a lower bound on sherpa-onnx's
advantage), and per-call costs of the predictor step and the joint at one row.  OASR runs three ways in turn
in each round, its earlier paths patched in and restored: session 5's (``torch.lstm_cell`` per layer, the
joint's linears through the modules), session 6's (one GEMM per layer over the row-major copies, the step
through the LSTM module: no input-gate table) and the current one (``LSTM.embedded_step``: layer 0's input
gates looked up in a table); each is checked against the current one (tokens, frames, scores).
"""

from __future__ import annotations

import argparse
import os
import time
import types
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from _common import machine, synth  # noqa: E402

torch.set_num_threads(1)


class Counting:
    """Counts a predictor's ``advance`` calls (emissions reaching the LSTM) around the real one."""

    def __init__(self, inner):
        self.inner, self.advances = inner, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def advance(self, state, tokens, emit):
        self.advances += 1
        return self.inner.advance(state, tokens, emit)


class CountingJoint:
    def __init__(self, inner):
        self.inner, self.joints = inner, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def joint(self, enc, pred):
        self.joints += 1
        return self.inner.joint(enc, pred)


def sessions(folder: Path):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    return (ort.InferenceSession(str(folder / "decoder.onnx"), options),
            ort.InferenceSession(str(folder / "joiner.onnx"), options))


class OnnxTdt:
    """sherpa-onnx's ``DecodeOneTDT`` over onnxruntime sessions, counting its decoder and joiner runs."""

    def __init__(self, decoder, joiner, vocab: int, max_tokens_per_frame: int = 5):
        self.decoder, self.joiner, self.vocab, self.max_per_frame = decoder, joiner, vocab, max_tokens_per_frame
        self.dec_in = [i.name for i in decoder.get_inputs()]
        self.dec_shapes = {i.name: i.shape for i in decoder.get_inputs()}
        self.join_in = [i.name for i in joiner.get_inputs()]
        self.decoder_runs = self.joiner_runs = 0

    def run_decoder(self, token: int, states):
        self.decoder_runs += 1
        feed = {self.dec_in[0]: np.array([[token]], dtype=np.int32), self.dec_in[1]: np.array([1], dtype=np.int32)}
        for name, value in zip(self.dec_in[2:], states, strict=True):
            feed[name] = value
        out = self.decoder.run(None, feed)
        return out[0], out[2:]

    def init_states(self):
        return [np.zeros([d if isinstance(d, int) else 1 for d in self.dec_shapes[n]], dtype=np.float32)
                for n in self.dec_in[2:]]

    def decode(self, enc: np.ndarray) -> list[int]:
        """``enc`` (T, D): one clip's encoder frames."""
        blank = self.vocab - 1
        dec_out, states = self.run_decoder(blank, self.init_states())
        tokens, t, per_frame = [], 0, 0
        while t < enc.shape[0]:
            self.joiner_runs += 1
            logit = self.joiner.run(None, {self.join_in[0]: enc[t][None, :, None],
                                           self.join_in[1]: dec_out})[0].reshape(-1)
            y = int(logit[:self.vocab].argmax())
            skip = int(logit[self.vocab:].argmax())
            if y != blank:
                tokens.append(y)
                dec_out, states = self.run_decoder(y, states)
                per_frame += 1
            if skip > 0:
                per_frame = 0
            if per_frame >= self.max_per_frame:
                per_frame, skip = 0, 1
            if y == blank and skip == 0:
                per_frame, skip = 0, 1
            t += skip
        return tokens


def lstm_cell_step(lstm, input: torch.Tensor, hx):
    """The one-step path as it was before session 6 (``torch.lstm_cell`` per layer): the session 5 row, with the
    joint's linears through the modules (no row-major copies)."""
    if hx is None:
        zeros = input.new_zeros(lstm.num_layers, input.shape[0], lstm.hidden_size)
        hx = (zeros, zeros)
    x, hs, cs = input[:, 0], [], []
    for layer in range(lstm.num_layers):
        weights = [getattr(lstm, f"{name}_l{layer}") for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
        h, c = torch.lstm_cell(x, (hx[0][layer], hx[1][layer]), *weights)
        hs.append(h)
        cs.append(c)
        x = h
    return x[:, None], (torch.stack(hs), torch.stack(cs))


def per_call(fn, repeats: int) -> float:
    fn()
    c0 = time.process_time()
    for _ in range(repeats):
        fn()
    return (time.process_time() - c0) / repeats * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True, help="benchmarks/fastconformer.py's --work folder")
    parser.add_argument("--clips", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from oasr.checkpoints.loading import load_pretrained
    from oasr.decoding.transducer import transducer_greedy_search
    from oasr.features import FeatureConfig, extract_features_batch
    from oasr_models_hf.fastconformer import predictor as heads

    few_row_linear = heads.few_row_linear

    folder = args.work / "tdt"
    loaded = load_pretrained(folder / "model.nemo")
    model = loaded.model
    vocab = model.config.vocab_size
    lengths = [2.0 + 10.0 * ((i * 7) % args.clips) / max(args.clips - 1, 1) for i in range(args.clips)]
    hidden = []
    with torch.inference_mode():
        for i, s in enumerate(lengths):
            feats, lens = extract_features_batch([torch.from_numpy(synth(s, seed=i))],
                                                 FeatureConfig.from_spec(loaded.feature_spec))
            h, n = model.encode_offline(feats, lens)
            hidden.append(h[:, :int(n[0])])
    frames = sum(h.shape[1] for h in hidden)
    decoder, joiner = sessions(folder)
    onnx = OnnxTdt(decoder, joiner, vocab)
    pred, join = Counting(model.predictor), CountingJoint(model.joiner)
    max_symbols = int((loaded.decoding_defaults.options or {}).get("max_symbols", 1))
    lstm, predictor_cls = model.predictor.lstm, type(model.predictor)
    table_run = predictor_cls._run

    def module_run(self, tokens, hc):  # the predictor step through the LSTM module: no input-gate table
        out, (h, c) = self.lstm(self.embedding(tokens)[:, None, :], hc)
        return out[:, 0], h, c

    def session5():
        predictor_cls._run = module_run
        lstm.forward = types.MethodType(lstm_cell_step, lstm)
        heads.few_row_linear = lambda module, x: module(x)

    def session6():
        predictor_cls._run = module_run

    def restore():
        predictor_cls._run = table_run
        lstm.__dict__.pop("forward", None)
        heads.few_row_linear = few_row_linear

    # OASR's rows: (setup, its paths), each run with its paths patched in, the current code restored after
    variants = {"OASR session 5 path (lstm_cell, F.linear)": session5,
                "OASR without the input-gate table (session 6 step)": session6, "OASR": restore}
    times = dict.fromkeys([*variants, "sherpa-onnx loop"], float("inf"))
    results: dict[str, list] = {}
    theirs = []
    for _ in range(args.repeats):
        with torch.inference_mode():
            for name, setup in variants.items():
                setup()
                pred.advances = join.joints = 0
                c0 = time.process_time()
                results[name] = [transducer_greedy_search(pred, join, model.joiner.project_encoder(h), [h.shape[1]],
                                                          blank_id=vocab - 1, max_symbols=max_symbols)[0]
                                 for h in hidden]
                times[name] = min(times[name], time.process_time() - c0)
                restore()
        onnx.decoder_runs = onnx.joiner_runs = 0
        arrays = [h[0].numpy() for h in hidden]
        c0 = time.process_time()
        theirs = [onnx.decode(a) for a in arrays]
        times["sherpa-onnx loop"] = min(times["sherpa-onnx loop"], time.process_time() - c0)
    hyps = results["OASR"]
    ours = [h.tokens for h in hyps]
    for name in list(variants)[:-1]:
        other = results[name]
        drift = max((abs(a.score - b.score) for a, b in zip(other, hyps, strict=True)), default=0.0)
        print(f"{name} vs OASR: tokens equal on {sum(a.tokens == b.tokens for a, b in zip(other, hyps, strict=True))}"
              f"/{len(hidden)} clips, frames equal on "
              f"{sum(a.token_frames == b.token_frames for a, b in zip(other, hyps, strict=True))}, "
              f"max |score difference| {drift:.1e}")
    same = sum(a == b for a, b in zip(ours, theirs, strict=True))
    emitted = sum(len(t) for t in ours)
    print(f"{args.clips} clips, {frames} encoder frames, {emitted} tokens (OASR); max_symbols {max_symbols}")
    print(f"predictor calls: OASR {pred.advances} + {len(hidden)} start states; "
          f"sherpa-onnx {onnx.decoder_runs} (incl. one start per clip)")
    print(f"joint calls: OASR {join.joints}, sherpa-onnx {onnx.joiner_runs}")
    print(f"tokens equal on {same}/{len(hidden)} clips")
    for name, value in times.items():
        print(f"search CPU {name}: {value:.3f} s")
    for name in variants:
        print(f"ratio sherpa-onnx loop / {name}: {times['sherpa-onnx loop'] / times[name]:.2f}x")
    # per-call costs at one row
    with torch.inference_mode():
        p = model.predictor
        state = p.init_state(1, torch.device("cpu"))
        tok, emit = torch.tensor([3]), torch.tensor([True])
        enc = model.joiner.project_encoder(hidden[0][:, 0])
        pp = model.joiner.project_predictor(p.predict(state))

        def untabled_step():
            session6()
            try:
                return model.joiner.project_predictor(p.predict(p.advance(state, tok, emit)))
            finally:
                restore()

        rows = {
            "OASR predictor step (advance + project_predictor)":
                lambda: model.joiner.project_predictor(p.predict(p.advance(state, tok, emit))),
            "OASR predictor step without the input-gate table": untabled_step,
            "OASR joint (one row, logits)": lambda: model.joiner.joint(enc, pp),
        }
        dec_states = onnx.init_states()
        dec_out, _ = onnx.run_decoder(3, dec_states)
        frame = hidden[0][0, 0].numpy()[None, :, None]
        rows["onnxruntime decoder.onnx step"] = lambda: onnx.run_decoder(3, dec_states)
        rows["onnxruntime joiner.onnx (projects the frame too)"] = lambda: joiner.run(
            None, {onnx.join_in[0]: frame, onnx.join_in[1]: dec_out})
        for name, fn in rows.items():
            print(f"{name}: {per_call(fn, 200):.3f} ms")
    print(f"machine: {machine()}")


if __name__ == "__main__":
    main()
