"""A streaming Zipformer transducer: OASR vs the same network exported to ONNX and run by onnxruntime.

The network is icefall's streaming Zipformer "small" (6 stacks of 2 layers, dims 192/256 x5,
feed-forward 512/768 x5, causal, chunk 16 / left context 128 embed frames, stateless decoder
context 2, decoder and joiner 512, 500 BPE pieces) with random weights; the joiner's blank bias is
set so that ~85 % of frames are blank, as for a trained model (a random head would emit almost
every frame and overstate decoding cost).

The peer is what sherpa-onnx runs: the torch module exported with ``torch.onnx.export`` the way
icefall's ``export-onnx-streaming.py`` does (encoder with every cache tensor as an input and an
output under icefall's names and metadata, the joiner's encoder projection folded in; decoder with
the joiner's decoder projection; joiner).  Two rows run it, one thread each: sherpa-onnx's own
``OnlineRecognizer`` on the three files, and onnxruntime sessions driven by this script's loop
(features by kaldi-native-fbank, sherpa-onnx's greedy search: one symbol per frame, the decoder
re-run when a row emitted) — the same loop also drives the torch module, which separates the
network's compute from the engine around it.  The script first checks the export: encoder outputs
chunk by chunk against the module's and the greedy tokens of all three.

Measured, one intra-op thread each, in the same process run:

* offline: audio seconds decoded per wall second — OASR's offline engine (whole-utterance chunk-masked
  encoder + transducer greedy) and the ONNX network decoding each utterance chunk by chunk (what
  sherpa-onnx does with a streaming model on a file);
* streaming: N concurrent streams, one 320 ms chunk (16 embed frames = 2 x 16 feature frames) each
  per step, all ready streams in one batched forward: p50 / p95 step latency.  N streams run in real
  time when the p95 stays under the 320 ms chunk; rows for the OASR engine (features + slot backend +
  stream search), the torch network in the script's loop, onnxruntime in the same loop, sherpa-onnx.

    python benchmarks/icefall.py [--streams 1,2,4,8,16] [--seconds 16] [--utts 4] [--int8] [--skip-onnx]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, synth  # noqa: E402

CHUNK = 16                      # embed frames per chunk (icefall's --chunk-size)
LEFT = 128                      # left context, embed frames (icefall's --left-context-frames)
STRIDE = 2 * CHUNK              # feature frames per chunk
WINDOW = STRIDE + 13            # feature frames per window
CHUNK_SECONDS = STRIDE * 0.01
VOCAB = 500
BLANK, UNK = 0, 2
BLANK_SHARE = 0.85
ENCODER_PROJ_GAIN = 8.0
REPO = Path(__file__).resolve().parents[1]
LANG = REPO.parent / "shared" / "fixtures" / "zipformer_transducer" / "data" / "lang_bpe_500"
BPE, TOKENS = LANG / "bpe.model", LANG / "tokens.txt"


# -- the network ----------------------------------------------------------------------------------------
def small_config():
    """icefall's streaming Zipformer "small" (egs/librispeech/ASR/zipformer RESULTS, causal)."""
    from oasr_models_icefall.transducer.config import JoinerConfig, StatelessDecoderConfig, TransducerModelConfig
    from oasr_models_icefall.zipformer.config import ZipformerEncoderConfig

    encoder = ZipformerEncoderConfig(
        num_encoder_layers=(2, 2, 2, 2, 2, 2), feedforward_dim=(512, 768, 768, 768, 768, 768),
        encoder_dim=(192, 256, 256, 256, 256, 256), causal=True, chunk_size=CHUNK, left_context_frames=LEFT)
    return TransducerModelConfig(
        vocab_size=VOCAB, encoder=encoder,
        decoder=StatelessDecoderConfig(vocab_size=VOCAB, decoder_dim=512, blank_id=BLANK, context_size=2),
        joiner=JoinerConfig(encoder_dim=encoder.output_size, decoder_dim=512, joiner_dim=512, vocab_size=VOCAB))


def build_model(seed: int = 0):
    from oasr_models_icefall.transducer.model import TransducerModel

    torch.manual_seed(seed)
    model = TransducerModel(small_config()).eval()
    with torch.no_grad():  # random encoder frames are alike: widen their joiner input so labels vary
        model.joiner.encoder_proj.weight.mul_(ENCODER_PROJ_GAIN)
    calibrate_blank(model)
    return model


def calibrate_blank(model) -> None:
    """Raise the joiner's blank bias until BLANK_SHARE of the (frame, label context) pairs of some audio
    pick blank."""
    from oasr.features import FeatureConfig, extract_features_batch
    from oasr_models_icefall import release

    feats, lens = extract_features_batch([torch.from_numpy(synth(8.0, seed=99))],
                                         FeatureConfig.from_spec(release.feature_spec()))
    generator = torch.Generator().manual_seed(0)
    contexts = torch.cat([model.predictor.init_state(1),
                          torch.randint(3, VOCAB, (31, 2), generator=generator)])  # after various labels
    with torch.no_grad():
        hidden, _ = model.encode_offline(feats, lens)
        pred = model.predictor.predict(contexts)
        logits = model.joiner(hidden[0][:, None], pred[None])  # (frames, contexts, V)
        margin = (logits.max(dim=-1).values - logits[..., BLANK]).flatten()
        model.joiner.output_linear.bias[BLANK] += float(torch.quantile(margin, BLANK_SHARE)) + 1e-3


def save_bundle(model, path: Path) -> Path:
    from oasr.checkpoints.loaded import LoadedModel
    from oasr.checkpoints.native import save_native
    from oasr.models import DecodingDefaults, LoadReport, TokenizerSpec
    from oasr_models_icefall import release

    if not BPE.is_file():
        raise SystemExit(f"the BPE model of the icefall fixtures is missing: {BPE}")
    loaded = LoadedModel(
        model=model, architecture="transducer", config=model.config,
        tokenizer_spec=TokenizerSpec(kind="sentencepiece", files={"model": str(BPE)}, special_ids=(0, 1, 2)),
        feature_spec=release.feature_spec(),
        decoding_defaults=DecodingDefaults(decode_type="transducer", blank_id=BLANK,
                                           options={"unk_id": UNK, "max_symbols": 1, "beam_size": 4}),
        load_report=LoadReport(), source=path, tokenizer_root=path)
    return save_native(loaded, path, overwrite=True)


# -- ONNX export (icefall's export-onnx-streaming.py layout) --------------------------------------------
class OnnxEncoder(torch.nn.Module):
    """One chunk: (x (N, WINDOW, 80), *caches) → (projected encoder out (N, CHUNK/2, J), *new caches)."""

    def __init__(self, model):
        super().__init__()
        self.encoder, self.proj = model.encoder, model.joiner.encoder_proj

    def forward(self, x, *states):
        from oasr_models_icefall.zipformer.streaming import chunk_step

        # OASR's chunk step: its TorchScript trace when run (CPU, no grad), the eager step when exported
        lens = torch.full_like(x[:, 0, 0], x.shape[1], dtype=torch.int64)
        hidden, _, new = chunk_step(self.encoder, x, lens, list(states), LEFT)
        return (self.proj(hidden), *new)


class OnnxDecoder(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.decoder, self.proj = model.predictor, model.joiner.decoder_proj

    def forward(self, y):
        return self.proj(self.decoder.predict(y))


class OnnxJoiner(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.joiner = model.joiner

    def forward(self, enc, dec):
        return self.joiner.joint(enc, dec)


def cache_layout(model) -> list[tuple[str, int]]:
    """(icefall's ONNX input name, batch axis) of every streaming cache tensor, in state-list order
    (``cached_key_0`` ... ``cached_conv2_11``, ``embed_states``, ``processed_lens``)."""
    out = []
    for name, _, axis in model.encoder._cache_shapes(LEFT):
        if name.startswith("layer"):
            layer, cache = name.removeprefix("layer").split(".")
            name = f"{cache}_{layer}"
        else:
            name = {"embed.cached_left_pad": "embed_states"}.get(name, name)
        out.append((name, axis))
    return out


def sherpa_metadata(model) -> dict[str, dict[str, str]]:
    """The metadata sherpa-onnx reads from each file (icefall's export-onnx-streaming.py writes it)."""
    config = model.config.encoder

    def join(values) -> str:
        return ",".join(str(v) for v in values)

    encoder = {"model_type": "zipformer2", "version": "1", "model_author": "k2-fsa",
               "comment": "streaming zipformer2", "decode_chunk_len": str(STRIDE), "T": str(WINDOW),
               "num_encoder_layers": join(config.num_encoder_layers), "encoder_dims": join(config.encoder_dim),
               "cnn_module_kernels": join(config.cnn_module_kernel),
               "left_context_len": join(LEFT // d for d in config.downsampling_factor),
               "query_head_dims": join(config.query_head_dim), "value_head_dims": join(config.value_head_dim),
               "num_heads": join(config.num_heads)}
    decoder = {"context_size": str(model.predictor.context_size), "vocab_size": str(VOCAB)}
    return {"encoder": encoder, "decoder": decoder, "joiner": {"joiner_dim": str(model.joiner.config.joiner_dim)}}


def add_metadata(file: Path, meta: dict[str, str]) -> None:
    import onnx

    graph = onnx.load(str(file))
    for key, value in meta.items():
        entry = graph.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(graph, str(file))


def export_onnx(model, out: Path) -> dict[str, Path]:

    out.mkdir(parents=True, exist_ok=True)
    layout = cache_layout(model)
    names = [n for n, _ in layout]
    files = {"encoder": out / "encoder.onnx", "decoder": out / "decoder.onnx", "joiner": out / "joiner.onnx"}
    _export(model, files, layout, names)
    for part, meta in sherpa_metadata(model).items():
        add_metadata(files[part], meta)
    return files


def _export(model, files: dict[str, Path], layout, names: list[str]) -> None:
    import warnings

    states = model.encoder.init_stream_state(1)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            OnnxEncoder(model).eval(), (torch.zeros(1, WINDOW, 80), *states), str(files["encoder"]),
            input_names=["x", *names], output_names=["encoder_out", *[f"new_{n}" for n in names]],
            dynamic_axes={"x": {0: "N"}, "encoder_out": {0: "N"},
                          **{n: {a: "N"} for n, a in layout}, **{f"new_{n}": {a: "N"} for n, a in layout}},
            opset_version=13, dynamo=False)
        torch.onnx.export(OnnxDecoder(model).eval(), (torch.zeros(1, 2, dtype=torch.int64),), str(files["decoder"]),
                          input_names=["y"], output_names=["decoder_out"],
                          dynamic_axes={"y": {0: "N"}, "decoder_out": {0: "N"}}, opset_version=13, dynamo=False)
        joiner_dim = model.joiner.config.joiner_dim
        torch.onnx.export(OnnxJoiner(model).eval(), (torch.zeros(1, joiner_dim), torch.zeros(1, joiner_dim)),
                          str(files["joiner"]), input_names=["encoder_out", "decoder_out"], output_names=["logit"],
                          dynamic_axes={"encoder_out": {0: "N"}, "decoder_out": {0: "N"}, "logit": {0: "N"}},
                          opset_version=13, dynamo=False)


# -- one greedy search loop, two backends ----------------------------------------------------------------
class OrtNet:
    """The exported network in onnxruntime sessions (one intra-op, one inter-op thread)."""

    def __init__(self, files: dict[str, Path], layout: list[tuple[str, int]], init_states):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        self.sessions = {k: ort.InferenceSession(str(f), opts, providers=["CPUExecutionProvider"])
                         for k, f in files.items()}
        self.layout = layout
        self.init_states = [s.numpy() for s in init_states]

    def init(self):
        return [s.copy() for s in self.init_states]

    def encode(self, x: np.ndarray, states: list[np.ndarray]):
        feeds = {"x": x, **{n: s for (n, _), s in zip(self.layout, states, strict=True)}}
        out = self.sessions["encoder"].run(None, feeds)
        return out[0], out[1:]

    def decode(self, y: np.ndarray) -> np.ndarray:
        return self.sessions["decoder"].run(None, {"y": y})[0]

    def join(self, enc: np.ndarray, dec: np.ndarray) -> np.ndarray:
        return self.sessions["joiner"].run(None, {"encoder_out": enc, "decoder_out": dec})[0]


class TorchNet:
    """The same three functions on the torch module (the OASR network without the engine around it)."""

    def __init__(self, model):
        self.enc, self.dec, self.joiner = OnnxEncoder(model), OnnxDecoder(model), OnnxJoiner(model)
        self.model = model

    def init(self):
        return [s.numpy() for s in self.model.encoder.init_stream_state(1)]

    @torch.no_grad()
    def encode(self, x, states):
        out = self.enc(torch.from_numpy(x), *[torch.from_numpy(s) for s in states])
        return out[0].numpy(), [t.numpy() for t in out[1:]]

    @torch.no_grad()
    def decode(self, y):
        return self.dec(torch.from_numpy(y)).numpy()

    @torch.no_grad()
    def join(self, enc, dec):
        return self.joiner(torch.from_numpy(enc), torch.from_numpy(dec)).numpy()


def stack(states: list[list[np.ndarray]], layout) -> list[np.ndarray]:
    return [np.concatenate([s[i] for s in states], axis=axis) for i, (_, axis) in enumerate(layout)]


def unstack(states: list[np.ndarray], layout, n: int) -> list[list[np.ndarray]]:
    parts = [np.split(s, n, axis=axis) for s, (_, axis) in zip(states, layout, strict=True)]
    return [[p[row] for p in parts] for row in range(n)]


class Stream:
    """One stream's features (kaldi-native-fbank, as sherpa-onnx), caches and greedy hypothesis."""

    def __init__(self, net, layout):
        import kaldi_native_fbank as knf

        opts = knf.FbankOptions()
        opts.frame_opts.dither = 0.0
        opts.frame_opts.snip_edges = False
        opts.mel_opts.num_bins = 80
        opts.mel_opts.high_freq = -400
        self.fbank = knf.OnlineFbank(opts)
        self.states = net.init()
        self.start = 0
        self.context = np.array([[-1, BLANK]], dtype=np.int64)
        self.tokens: list[int] = []
        self.dec_out: np.ndarray | None = None

    def window(self) -> np.ndarray | None:
        if self.fbank.num_frames_ready < self.start + WINDOW:
            return None
        frames = np.stack([self.fbank.get_frame(i) for i in range(self.start, self.start + WINDOW)])
        self.start += STRIDE
        return frames.astype(np.float32)


def step(net, streams: list[Stream], layout) -> int:
    """One batched chunk over every stream with a full window; sherpa-onnx's greedy search."""
    ready = [(s, w) for s in streams if (w := s.window()) is not None]
    if not ready:
        return 0
    rows = [s for s, _ in ready]
    enc, new = net.encode(np.stack([w for _, w in ready]), stack([s.states for s in rows], layout))
    for s, st in zip(rows, unstack(new, layout, len(rows)), strict=True):
        s.states = st
    contexts = np.concatenate([s.context for s in rows])
    dec = net.decode(contexts)
    for t in range(enc.shape[1]):
        logits = net.join(enc[:, t], dec)
        best = logits.argmax(axis=-1)
        emitted = [i for i, y in enumerate(best) if y not in (BLANK, UNK)]
        for i in emitted:
            rows[i].tokens.append(int(best[i]))
            contexts[i] = (contexts[i, 1], best[i])
        if emitted:
            dec = net.decode(contexts)
    for i, s in enumerate(rows):
        s.context = contexts[i : i + 1]
    return len(rows)


def stream_loop(net, layout, audio: list[np.ndarray]) -> tuple[list[float], float, list[Stream]]:
    """Feed every stream one chunk of audio, then one batched step; (step latencies, compute, streams)."""
    streams = [Stream(net, layout) for _ in audio]
    piece = int(CHUNK_SECONDS * 16000)
    latencies, compute = [], 0.0
    for pos in range(0, max(a.size for a in audio), piece):
        t0 = time.perf_counter()
        for s, a in zip(streams, audio, strict=True):
            if pos < a.size:
                s.fbank.accept_waveform(16000, a[pos : pos + piece])
        if step(net, streams, layout):
            latencies.append(time.perf_counter() - t0)
        compute += time.perf_counter() - t0
    return latencies, compute, streams


def quantize_int8(files: dict[str, Path]) -> dict[str, Path]:
    """icefall's int8 export: onnxruntime's dynamic quantization of the MatMul weights (and the
    decoder's embedding Gather), as export-onnx-streaming.py writes the ``*.int8.onnx`` files."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    out = {}
    for part, file in files.items():
        out[part] = file.with_suffix(".int8.onnx")
        ops = ["MatMul", "Gather"] if part == "decoder" else ["MatMul"]
        quantize_dynamic(model_input=str(file), model_output=str(out[part]), op_types_to_quantize=ops,
                         weight_type=QuantType.QInt8)
    return out


def sherpa_recognizer(files: dict[str, Path]):
    """sherpa-onnx's OnlineRecognizer on the exported files (greedy search, one thread)."""
    import sherpa_onnx

    return sherpa_onnx.OnlineRecognizer.from_transducer(
        tokens=str(TOKENS), encoder=str(files["encoder"]), decoder=str(files["decoder"]),
        joiner=str(files["joiner"]), num_threads=1, sample_rate=16000, feature_dim=80,
        decoding_method="greedy_search")


def sherpa_loop(recognizer, audio: list[np.ndarray]) -> tuple[list[float], float, list[list[str]]]:
    """The same feeding as :func:`stream_loop`; sherpa-onnx batches the ready streams in ``decode_streams``."""
    streams = [recognizer.create_stream() for _ in audio]
    piece = int(CHUNK_SECONDS * 16000)
    latencies, compute = [], 0.0
    for pos in range(0, max(a.size for a in audio), piece):
        t0 = time.perf_counter()
        for s, a in zip(streams, audio, strict=True):
            if pos < a.size:
                s.accept_waveform(16000, a[pos : pos + piece])
        ready = [s for s in streams if recognizer.is_ready(s)]
        if ready:
            recognizer.decode_streams(ready)
            latencies.append(time.perf_counter() - t0)
        compute += time.perf_counter() - t0
    return latencies, compute, [recognizer.get_result_all(s).tokens for s in streams]


# -- the OASR engine -------------------------------------------------------------------------------------
def engine_offline(bundle: Path, audio: list[np.ndarray], quantization: str | None = None) -> float:
    from oasr.engine import Engine, EngineConfig

    engine = Engine(EngineConfig(model=str(bundle), max_batch_size=1, quantization=quantization))
    engine.transcribe_outputs(audio[0][:32000])  # warm up
    t0 = time.perf_counter()
    outputs = engine.transcribe_outputs(list(audio))
    elapsed = time.perf_counter() - t0
    assert all(o.error is None for o in outputs), [o.error for o in outputs]
    return elapsed


def engine_streams(bundle: Path, audio: list[np.ndarray], quantization: str | None = None) -> tuple[list[float], float]:
    from oasr.engine import Engine, EngineConfig

    seconds = max(a.size for a in audio) / 16000
    engine = Engine(EngineConfig(model=str(bundle), service_mode="streaming", chunk_size=CHUNK,
                                 num_left_chunks=LEFT // CHUNK, max_streams=len(audio),
                                 max_stream_seconds=seconds + 5, quantization=quantization))
    piece = int(CHUNK_SECONDS * 16000)
    for i in range(len(audio)):
        engine.add_streaming_request(request_id=f"s{i}")
    latencies, compute, pos = [], 0.0, 0
    while engine.has_unfinished_requests():
        last = pos + piece >= audio[0].size
        t0 = time.perf_counter()
        for i, a in enumerate(audio):
            if pos < a.size:
                engine.feed_chunk(f"s{i}", a[pos : pos + piece], is_last=last)
        pos += piece
        batches = engine.metrics.batches
        engine.step()
        dt = time.perf_counter() - t0
        compute += dt
        if engine.metrics.batches > batches and not last:
            latencies.append(dt)
    return latencies, compute


def summary(latencies: list[float], compute: float, seconds: float) -> tuple[str, bool]:
    lat = np.array(latencies[1:] or latencies)  # the first step includes warm-up allocations
    p50, p95 = np.percentile(lat, 50), np.percentile(lat, 95)
    ok = "yes" if p95 < CHUNK_SECONDS else "no"
    return f"{p50 * 1000:>8.1f} {p95 * 1000:>8.1f} {compute / seconds:>6.3f} {ok:>9}", p95 < CHUNK_SECONDS


def parity(torch_net: TorchNet, ort_net: OrtNet, recognizer, layout) -> str:
    """The exported graph computes what the module computes: encoder outputs over 8 s of chunks, and
    the greedy tokens of the torch loop, the onnxruntime loop and sherpa-onnx."""
    audio = [synth(8.0, seed=7)]
    feats = Stream(torch_net, layout)
    feats.fbank.accept_waveform(16000, audio[0])
    states = {"torch": torch_net.init(), "ort": ort_net.init()}
    worst = 0.0
    while (window := feats.window()) is not None:
        out_t, states["torch"] = torch_net.encode(window[None], states["torch"])
        out_o, states["ort"] = ort_net.encode(window[None], states["ort"])
        worst = max(worst, float(np.abs(out_t - out_o).max() / np.abs(out_t).max()))
    tokens = [stream_loop(net, layout, audio)[2][0].tokens for net in (torch_net, ort_net)]
    pieces = {int(i): p for p, i in (line.split() for line in TOKENS.read_text(encoding="utf-8").splitlines())}
    sherpa = sherpa_loop(recognizer, audio)[2][0]
    same = "identical" if tokens[0] == tokens[1] else "DIFFERENT"
    # sherpa-onnx reports each piece with its word-boundary mark as a space
    ours = [pieces[t].replace("\u2581", " ") for t in tokens[0]]
    same_sherpa = "identical" if ours == list(sherpa) else "DIFFERENT"
    return (f"parity on 8 s: encoder outputs torch vs onnxruntime within {worst:.1e} rel; greedy tokens "
            f"torch vs onnxruntime {same}, torch vs sherpa-onnx {same_sherpa} ({len(tokens[0])} tokens)")


def op_counts(model, encoder_file: Path) -> str:
    """Operators per encoder chunk: eager torch's dispatched aten ops vs the exported graph's nodes."""
    import onnx
    from torch.profiler import ProfilerActivity, profile

    from oasr_models_icefall.zipformer.streaming import streaming_forward

    x, states = torch.zeros(1, WINDOW, 80), model.encoder.init_stream_state(1)
    lens = torch.full((1,), WINDOW, dtype=torch.int64)
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:  # the eager step
        streaming_forward(model.encoder, x, lens, states, LEFT)
    aten = sum(e.count for e in prof.key_averages() if e.key.startswith("aten::"))
    nodes = len(onnx.load(str(encoder_file)).graph.node)
    return f"operators per encoder chunk: {aten} aten ops dispatched by eager torch, {nodes} ONNX graph nodes"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", default="1,2,4,8,16")
    parser.add_argument("--seconds", type=float, default=16.0, help="audio per stream / utterance")
    parser.add_argument("--utts", type=int, default=4, help="utterances in the offline measurement")
    parser.add_argument("--skip-onnx", action="store_true", help="OASR rows only")
    parser.add_argument("--int8", action="store_true", help="add OASR int8 and sherpa-onnx int8 rows")
    parser.add_argument("--work-dir", default="/tmp/oasr-bench/icefall-small")
    args = parser.parse_args()
    torch.set_num_threads(1)
    work = Path(args.work_dir)
    model = build_model()
    bundle = save_bundle(model, work / "bundle")
    layout = cache_layout(model)
    torch_net = TorchNet(model)
    runners = {"torch network": lambda audio: stream_loop(torch_net, layout, audio)}
    if not args.skip_onnx:
        files = export_onnx(model, work / "onnx")
        ort_net = OrtNet(files, layout, model.encoder.init_stream_state(1))
        recognizer = sherpa_recognizer(files)
        runners["onnxruntime"] = lambda audio: stream_loop(ort_net, layout, audio)
        runners["sherpa-onnx"] = lambda audio: sherpa_loop(recognizer, audio)
        if args.int8:
            recognizer_int8 = sherpa_recognizer(quantize_int8(files))
            runners["sherpa-onnx int8"] = lambda audio: sherpa_loop(recognizer_int8, audio)
    engines = ("OASR engine", None), *((("OASR int8", "int8"),) if args.int8 else ())
    n_params = sum(p.numel() for p in model.parameters())
    print(f"machine: {machine()}")
    print(f"model: icefall streaming Zipformer 'small' transducer, {n_params / 1e6:.1f} M parameters (random, "
          f"blank bias calibrated to {BLANK_SHARE:.0%} blank), chunk {CHUNK} / left {LEFT} embed frames "
          f"({CHUNK_SECONDS * 1000:.0f} ms chunks), greedy search, one thread per runtime")
    if not args.skip_onnx:
        print(parity(torch_net, ort_net, recognizer, layout))
        print(op_counts(model, files["encoder"]))

    utts = [synth(args.seconds, seed=100 + i) for i in range(args.utts)]
    total = args.utts * args.seconds
    print(f"\noffline: {args.utts} x {args.seconds:.0f} s")
    print(f"{'runtime':>38} {'audio s / s':>12} {'RTF':>7}")
    rate = {}
    for name, quantization in engines:
        elapsed = engine_offline(bundle, utts, quantization)
        rate[name] = total / elapsed
        print(f"{name + ' (whole-utterance encoder)':>38} {rate[name]:>12.1f} {elapsed / total:>7.3f}")
    for name, runner in runners.items():
        elapsed = sum(runner([u])[1] for u in utts)
        rate[name] = total / elapsed
        print(f"{name + ' (chunk by chunk)':>38} {rate[name]:>12.1f} {elapsed / total:>7.3f}")
    for ours, peer in (("OASR engine", "onnxruntime"), ("OASR engine", "sherpa-onnx"),
                       ("OASR int8", "sherpa-onnx int8")):
        if ours in rate and peer in rate:
            print(f"ratio {ours} / {peer}: {rate[ours] / rate[peer]:.2f}x audio-seconds per second")

    print(f"\nstreaming: {args.seconds:.0f} s per stream, one {CHUNK_SECONDS * 1000:.0f} ms chunk per stream per step")
    print(f"{'streams':>7} {'runtime':>14} {'p50 ms':>8} {'p95 ms':>8} {'RTF':>6} {'real time':>9}")
    best: dict[str, int] = {}
    for n in [int(s) for s in args.streams.split(",")]:
        audio = [synth(args.seconds, seed=i) for i in range(n)]
        results = {name: engine_streams(bundle, audio, quantization) for name, quantization in engines}
        results.update({name: runner(audio)[:2] for name, runner in runners.items()})
        for name, (latencies, compute) in results.items():
            line, ok = summary(latencies, compute, args.seconds)
            print(f"{n:>7} {name:>14} {line}")
            best[name] = n if ok else best.get(name, 0)
    for name, count in best.items():
        print(f"real-time streams on one core, {name}: {count} (largest tested count with p95 < "
              f"{CHUNK_SECONDS * 1000:.0f} ms)")


if __name__ == "__main__":
    main()
