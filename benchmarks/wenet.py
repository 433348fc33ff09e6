"""Offline throughput of the OASR WeNet Conformer against the same graph written the way WeNet writes it.

WeNet cannot be installed here, so the peer is a plain torch-eager transcription of WeNet's
``ConformerEncoder`` + ``CTC`` op sequence (``nn.Linear``/``nn.Conv1d``/``nn.Conv2d``, explicit
``matmul`` + masked softmax relative-position attention, (B, C, T) convolution module), loaded with the
*same* weights in WeNet's key layout; the script first checks both produce the same log-probs.

The model is WeNet-sized (12 blocks, d=256, 4 heads, FFN 2048, kernel 15, causal, vocab 5000, random
weights).  Batches of varied length (2–16 s, bucketed by length as the engine does) run in one thread;
the peers alternate batch by batch and each batch counts its best repeat (a co-tenant only adds time).  Printed: audio seconds per wall
second for each, their ratio, and the machine.

It also measures what sequence packing could buy at most: the padded batch against the same rows run
one by one (no padding work at all).

The runtime peer (``--onnx``, on by default): the same weights exported from the WeNet-layout module to
ONNX and run by onnxruntime — what WeNet's own runtime and sherpa-onnx users run — in fp32 and with
onnxruntime's dynamic int8 quantization as WeNet's ``export_onnx_cpu.py`` applies it (MatMul, per-channel,
uint8 weights), beside OASR fp32 and OASR int8 (``quantize_model_int8``).  Printed with the speeds: the
share of CTC frames whose argmax int8 keeps from fp32, for both, on this model and on the WeNet fixture
model over the fixture audio.

``--profile``: only where the time goes in one batch (torch profiler self CPU per op for OASR fp32,
onnxruntime's own profile per op type for onnxruntime fp32).

Usage: python benchmarks/wenet.py [--batches 6] [--batch-size 8] [--repeats 2] [--threads 1]
[--no-onnx | --onnx-only | --profile]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import time

import torch
import torch.nn.functional as F
from _common import cpu_model
from torch import nn

from oasr_models_wenet.config import ConformerEncoderConfig, ConformerModelConfig
from oasr_models_wenet.model import ConformerModel

FRAME_SECONDS = 0.01


# -- the peer: WeNet's graph, eager, in WeNet's style -------------------------------------------------
class PeerFeedForward(nn.Module):
    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.w_1, self.w_2, self.activation = nn.Linear(d, hidden), nn.Linear(hidden, d), nn.SiLU()

    def forward(self, x):
        return self.w_2(self.activation(self.w_1(x)))


class PeerRelAttention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.h, self.d_k = heads, d // heads
        self.linear_q, self.linear_k, self.linear_v, self.linear_out = (nn.Linear(d, d) for _ in range(4))
        self.linear_pos = nn.Linear(d, d, bias=False)
        self.pos_bias_u = nn.Parameter(torch.zeros(heads, self.d_k))
        self.pos_bias_v = nn.Parameter(torch.zeros(heads, self.d_k))

    def forward(self, x, mask, pos_emb):
        b, t, d = x.shape
        q = self.linear_q(x).view(b, t, self.h, self.d_k)
        k = self.linear_k(x).view(b, t, self.h, self.d_k).transpose(1, 2)
        v = self.linear_v(x).view(b, t, self.h, self.d_k).transpose(1, 2)
        p = self.linear_pos(pos_emb).view(1, t, self.h, self.d_k).transpose(1, 2)
        ac = torch.matmul((q + self.pos_bias_u).transpose(1, 2), k.transpose(-2, -1))
        bd = torch.matmul((q + self.pos_bias_v).transpose(1, 2), p.transpose(-2, -1))
        scores = (ac + bd) / math.sqrt(self.d_k)
        hidden = ~mask.unsqueeze(1)
        attn = torch.softmax(scores.masked_fill(hidden, -float("inf")).float(), dim=-1).masked_fill(hidden, 0.0)
        out = torch.matmul(attn, v).transpose(1, 2).contiguous().view(b, t, d)
        return self.linear_out(out)


class PeerConvModule(nn.Module):
    def __init__(self, d: int, kernel: int):
        super().__init__()
        self.lorder = kernel - 1
        self.pointwise_conv1 = nn.Conv1d(d, 2 * d, 1)
        self.depthwise_conv = nn.Conv1d(d, d, kernel, groups=d)
        self.norm = nn.LayerNorm(d)
        self.activation = nn.SiLU()
        self.pointwise_conv2 = nn.Conv1d(d, d, 1)

    def forward(self, x, mask_pad):
        x = x.transpose(1, 2).masked_fill(~mask_pad, 0.0)
        x = F.pad(x, (self.lorder, 0))
        x = F.glu(self.pointwise_conv1(x), dim=1)
        x = self.depthwise_conv(x).transpose(1, 2)
        x = self.activation(self.norm(x)).transpose(1, 2)
        x = self.pointwise_conv2(x).masked_fill(~mask_pad, 0.0)
        return x.transpose(1, 2)


class PeerLayer(nn.Module):
    def __init__(self, d: int, heads: int, hidden: int, kernel: int):
        super().__init__()
        self.self_attn = PeerRelAttention(d, heads)
        self.feed_forward, self.feed_forward_macaron = PeerFeedForward(d, hidden), PeerFeedForward(d, hidden)
        self.conv_module = PeerConvModule(d, kernel)
        for name in ("norm_ff", "norm_mha", "norm_ff_macaron", "norm_conv", "norm_final"):
            setattr(self, name, nn.LayerNorm(d))

    def forward(self, x, mask, pos_emb, mask_pad):
        x = x + 0.5 * self.feed_forward_macaron(self.norm_ff_macaron(x))
        x = x + self.self_attn(self.norm_mha(x), mask, pos_emb)
        x = x + self.conv_module(self.norm_conv(x), mask_pad)
        x = x + 0.5 * self.feed_forward(self.norm_ff(x))
        return self.norm_final(x)


class PeerConformer(nn.Module):
    """Encoder + CTC with WeNet's module tree (so WeNet-layout weights load with strict=True)."""

    def __init__(self, cfg: ConformerEncoderConfig, vocab: int):
        super().__init__()
        d = cfg.output_size
        self.encoder = nn.Module()
        self.encoder.global_cmvn = nn.Module()
        self.encoder.global_cmvn.register_buffer("mean", torch.zeros(cfg.input_dim))
        self.encoder.global_cmvn.register_buffer("istd", torch.ones(cfg.input_dim))
        self.encoder.embed = nn.Module()
        self.encoder.embed.conv = nn.Sequential(nn.Conv2d(1, d, 3, 2), nn.ReLU(), nn.Conv2d(d, d, 3, 2), nn.ReLU())
        self.encoder.embed.out = nn.Sequential(nn.Linear(d * (((cfg.input_dim - 1) // 2 - 1) // 2), d))
        self.encoder.encoders = nn.ModuleList(
            PeerLayer(d, cfg.attention_heads, cfg.linear_units, cfg.cnn_module_kernel) for _ in range(cfg.num_blocks))
        self.encoder.after_norm = nn.LayerNorm(d)
        self.ctc = nn.Module()
        self.ctc.ctc_lo = nn.Linear(d, vocab)
        position = torch.arange(5000, dtype=torch.float32).unsqueeze(1)
        div = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * -(math.log(10000.0) / d))
        pe = torch.zeros(5000, d)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(position * div), torch.cos(position * div)
        self.register_buffer("pe", pe.unsqueeze(0), persistent=False)
        self.d = d

    def forward(self, feats, lens):
        enc = self.encoder
        masks = (torch.arange(feats.size(1))[None, :] < lens[:, None]).unsqueeze(1)
        x = (feats - enc.global_cmvn.mean) * enc.global_cmvn.istd
        x = enc.embed.conv(x.unsqueeze(1))
        b, c, t, f = x.shape
        x = enc.embed.out(x.transpose(1, 2).contiguous().view(b, t, c * f)) * math.sqrt(self.d)
        masks = masks[:, :, 2::2][:, :, 2::2]
        pos_emb = self.pe[:, :t]
        for layer in enc.encoders:
            x = layer(x, masks, pos_emb, masks)
        x = enc.after_norm(x)
        return F.log_softmax(self.ctc.ctc_lo(x), dim=2), masks.squeeze(1).sum(1)


# -- set-up ---------------------------------------------------------------------------------------------
def wenet_sized() -> ConformerModelConfig:
    encoder = ConformerEncoderConfig(input_dim=80, output_size=256, attention_heads=4, linear_units=2048,
                                     num_blocks=12, cnn_module_kernel=15, causal=True, cnn_module_norm="layer_norm",
                                     use_dynamic_chunk=True)
    return ConformerModelConfig(vocab_size=5000, encoder=encoder)


def build(seed: int = 0) -> tuple[ConformerModel, PeerConformer]:
    torch.manual_seed(seed)
    config = wenet_sized()
    model = ConformerModel(config).eval()
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if name.endswith(("pos_bias_u", "pos_bias_v")):
                tensor.normal_(0, 0.1)
            elif name.endswith("global_cmvn.mean"):
                tensor.normal_(10, 1)
            elif name.endswith("global_cmvn.istd"):
                tensor.uniform_(0.2, 0.4)
    peer = PeerConformer(config.encoder, config.vocab_size).eval()
    wenet_layout = {k.replace("encoder.embed.out.", "encoder.embed.out.0."): v
                    for k, v in model.state_dict().items()}
    peer.load_state_dict(wenet_layout, strict=True)
    return model, peer


def make_batches(n_batches: int, batch_size: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Utterances of 2–16 s, sorted by length and cut into batches (the engine's bucketing)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = sorted(int(x) for x in torch.randint(200, 1600, (n_batches * batch_size,), generator=gen))
    batches = []
    for i in range(n_batches):
        rows = lengths[i * batch_size:(i + 1) * batch_size]
        feats = torch.randn(len(rows), max(rows), 80, generator=gen) * 3 + 10
        batches.append((feats, torch.tensor(rows)))
    return batches


def machine() -> str:
    return (f"{cpu_model()}, {os.cpu_count()} CPUs, {torch.get_num_threads()} torch thread(s), torch {torch.__version__}, "
            f"python {platform.python_version()}, {platform.system()} {platform.machine()}")


def engine_run(model: ConformerModel, batches, batch_size: int, repeats: int) -> float:
    """The full offline engine over audio of the same lengths as ``batches`` (best of ``repeats``)."""
    import tempfile
    from pathlib import Path

    import numpy as np

    from oasr.checkpoints.loaded import LoadedModel
    from oasr.engine import Engine, EngineConfig
    from oasr.models import DecodingDefaults, FeatureSpec, LoadReport, TokenizerSpec

    units = Path(tempfile.mkdtemp()) / "units.txt"
    units.write_text("".join(f"{'<blank>' if i == 0 else f'w{i}'} {i}\n" for i in range(model.config.vocab_size)))
    loaded = LoadedModel(model=model, architecture="conformer", config=model.config,
                         tokenizer_spec=TokenizerSpec(kind="symbol_table", files={"units": str(units)}, special_ids=(0,)),
                         feature_spec=FeatureSpec(kind="kaldi_fbank", audio_scale=32768.0),
                         decoding_defaults=DecodingDefaults(decode_type="ctc", blank_id=0),
                         load_report=LoadReport(), source=units.parent, tokenizer_root=units.parent)
    engine = Engine(EngineConfig(max_batch_size=batch_size, schedule_policy="bucket"), loaded=loaded)
    rng = np.random.default_rng(0)
    audio = [(0.1 * rng.standard_normal(int(n) * 160 + 240)).astype(np.float32)
             for _, lens in batches for n in lens.tolist()]
    engine.transcribe_outputs(audio[:2], sample_rate=16000)  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        outs = engine.transcribe_outputs(audio, sample_rate=16000)
        times.append(time.perf_counter() - start)
        assert all(o.finish_reason == "stop" for o in outs)
    return min(times)


def timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


# -- the runtime peer: onnxruntime on the exported graph ------------------------------------------------
def export_onnx(peer: PeerConformer, folder: str) -> tuple[str, str]:
    """The peer's graph as ONNX (dynamic batch and time) and its dynamic int8 quantization."""
    import warnings

    from onnxruntime.quantization import QuantType, quantize_dynamic

    fp32 = os.path.join(folder, "wenet_ctc.onnx")
    int8 = os.path.join(folder, "wenet_ctc.int8.onnx")
    feats, lens = torch.randn(2, 300, 80), torch.tensor([300, 240])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(peer, (feats, lens), fp32, input_names=["feats", "feats_lengths"],
                          output_names=["ctc_log_probs", "lengths"], opset_version=17, dynamo=False,
                          dynamic_axes={"feats": {0: "B", 1: "T"}, "feats_lengths": {0: "B"},
                                        "ctc_log_probs": {0: "B", 1: "T_out"}, "lengths": {0: "B"}})
        quantize_dynamic(fp32, int8, op_types_to_quantize=["MatMul"], per_channel=True, reduce_range=False,
                         weight_type=QuantType.QUInt8)
    return fp32, int8


def ort_session(path: str, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])

    def run(feats: torch.Tensor, lens: torch.Tensor):
        log_probs, out_lens = session.run(None, {"feats": feats.numpy(), "feats_lengths": lens.numpy()})
        return torch.from_numpy(log_probs), torch.from_numpy(out_lens)

    return run


def argmax_agreement(pairs) -> float:
    """The share of valid frames whose CTC argmax is the same in both runs of each (a, b, lengths)."""
    same = total = 0
    for a, b, lens in pairs:
        for row, n in enumerate(lens.tolist()):
            same += int((a[row, :n].argmax(-1) == b[row, :n].argmax(-1)).sum())
            total += n
    return same / max(total, 1)


def fixture_agreement(threads: int) -> tuple[float, float] | None:
    """int8 vs fp32 CTC argmax agreement of the WeNet fixture model on the fixture audio (OASR, onnxruntime)."""
    import tempfile
    from pathlib import Path

    from oasr.audio import load
    from oasr.checkpoints import load_pretrained
    from oasr.features.config import FeatureConfig
    from oasr.features.registry import build_extractor
    from oasr.layers.quant import quantize_model_int8

    root = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures"
    if not (root / "wenet_u2pp" / "model").is_dir():
        return None
    loaded = load_pretrained(root / "wenet_u2pp" / "model")
    config = FeatureConfig.from_spec(loaded.feature_spec)
    extractor = build_extractor(config)
    feats = []
    for i in (0, 1):
        samples = torch.from_numpy(load(str(root / "audio" / f"clip{i}.wav"), 16000)) * config.audio_scale
        out, out_lens = extractor(samples[None], torch.tensor([samples.numel()]))
        feats.append(out[0, : int(out_lens[0])])
    lens = torch.tensor([f.shape[0] for f in feats])
    batch = torch.nn.utils.rnn.pad_sequence(feats, batch_first=True)
    model = loaded.model.eval()
    int8 = load_pretrained(root / "wenet_u2pp" / "model").model.eval()
    quantize_model_int8(int8)
    peer = PeerConformer(model.config.encoder, model.config.vocab_size).eval()
    peer.load_state_dict({k.replace("encoder.embed.out.", "encoder.embed.out.0."): v
                          for k, v in model.state_dict().items() if k.startswith(("encoder.", "ctc."))
                          and not k.endswith(".pe")}, strict=False)
    with torch.inference_mode(), tempfile.TemporaryDirectory() as folder:
        fp32_path, int8_path = export_onnx(peer, folder)
        ours, our_lens = model.forward_offline(batch, lens)
        ours8, _ = int8.forward_offline(batch, lens)
        theirs, their_lens = ort_session(fp32_path, threads)(batch, lens)
        theirs8, _ = ort_session(int8_path, threads)(batch, lens)
    return argmax_agreement([(ours, ours8, our_lens)]), argmax_agreement([(theirs, theirs8, their_lens)])


def onnx_section(model: ConformerModel, peer: PeerConformer, batches, audio: float, repeats: int, threads: int) -> None:
    import tempfile

    from oasr.layers.quant import quantize_model_int8

    int8, _ = build()  # the same seeded weights
    quantize_model_int8(int8)
    with tempfile.TemporaryDirectory() as folder, torch.inference_mode():
        fp32_path, int8_path = export_onnx(peer, folder)
        runners = {"oasr fp32": model.forward_offline, "oasr int8": int8.forward_offline,
                   "onnxruntime fp32": ort_session(fp32_path, threads),
                   "onnxruntime int8": ort_session(int8_path, threads)}
        outputs = {name: [run(*batch) for batch in batches[:2]] for name, run in runners.items()}
        err = max((a[0][row, :n] - b[0][row, :n]).abs().max().item()
                  for a, b in zip(outputs["oasr fp32"], outputs["onnxruntime fp32"], strict=True)
                  for row, n in enumerate(a[1].tolist()))
        runs: dict[str, list[list[float]]] = {name: [[] for _ in batches] for name in runners}
        cpu: dict[str, list[list[float]]] = {name: [[] for _ in batches] for name in runners}
        for _ in range(repeats):
            for i, batch in enumerate(batches):
                for name, run in runners.items():
                    start = time.process_time()
                    runs[name][i].append(timed(run, *batch))
                    cpu[name][i].append(time.process_time() - start)
    best = {name: sum(min(ts) for ts in v) for name, v in runs.items()}
    best_cpu = {name: sum(min(ts) for ts in v) for name, v in cpu.items()}
    print(f"-- runtime peer: onnxruntime on the exported graph (max |log-prob diff| fp32 vs oasr fp32 {err:.2e})")
    for name, seconds in best.items():
        print(f"{name:<17}: {audio / seconds:8.1f} audio s / s  ({seconds:.2f} s wall, {best_cpu[name]:.2f} s CPU)")
    print(f"ratio fp32 (oasr / onnxruntime): {best['onnxruntime fp32'] / best['oasr fp32']:.2f}x; "
          f"int8: {best['onnxruntime int8'] / best['oasr int8']:.2f}x")
    # on a shared box the process's own CPU time is what a co-tenant disturbs least
    print(f"ratio of CPU time (onnxruntime / oasr): fp32 {best_cpu['onnxruntime fp32'] / best_cpu['oasr fp32']:.2f}x; "
          f"int8 {best_cpu['onnxruntime int8'] / best_cpu['oasr int8']:.2f}x")
    agree = {name: argmax_agreement([(a[0], b[0], a[1]) for a, b in zip(outputs[f"{name} fp32"],
                                                                        outputs[f"{name} int8"], strict=True)])
             for name in ("oasr", "onnxruntime")}
    print(f"int8 vs fp32 CTC argmax agreement (WeNet-sized, random features): oasr {100 * agree['oasr']:.1f}%, "
          f"onnxruntime {100 * agree['onnxruntime']:.1f}%")
    fixture = fixture_agreement(threads)
    if fixture is None:
        print("int8 vs fp32 on the WeNet fixture: ../shared/fixtures not found")
    else:
        print(f"int8 vs fp32 CTC argmax agreement (WeNet fixture model, fixture audio): oasr {100 * fixture[0]:.1f}%, "
              f"onnxruntime {100 * fixture[1]:.1f}%")


def profile_section(model: ConformerModel, peer: PeerConformer, batch, threads: int) -> None:
    """Where the CPU time goes in one batch: OASR fp32's self CPU per op (torch profiler) and
    onnxruntime fp32's own profile (``enable_profiling``) summed per op type, on the same graph."""
    import collections
    import json
    import tempfile

    import onnxruntime as ort
    from torch.profiler import ProfilerActivity, profile

    with torch.inference_mode():
        for _ in range(2):
            model.forward_offline(*batch)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            model.forward_offline(*batch)
    print(f"-- OASR fp32, batch {tuple(batch[0].shape)}: self CPU per op")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
    with tempfile.TemporaryDirectory() as folder:
        fp32_path, _ = export_onnx(peer, folder)
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(folder, "ort")
        session = ort.InferenceSession(fp32_path, options, providers=["CPUExecutionProvider"])
        inputs = {"feats": batch[0].numpy(), "feats_lengths": batch[1].numpy()}
        for _ in range(3):
            session.run(None, inputs)
        with open(session.end_profiling()) as f:
            events = json.load(f)
    last = [e for e in events if e.get("name") == "model_run"][-1]
    per_op: collections.Counter = collections.Counter()
    for e in events:
        if (e.get("cat") == "Node" and e["name"].endswith("_kernel_time")
                and last["ts"] <= e["ts"] <= last["ts"] + last["dur"]):
            per_op[e["args"]["op_name"]] += e["dur"] / 1e3
    total = sum(per_op.values())
    print(f"-- onnxruntime fp32, same batch: kernel time per op type (last of 3 runs), total {total:.0f} ms")
    for op, ms in per_op.most_common(12):
        print(f"{op:<24} {ms:9.1f} ms {100 * ms / total:5.1f} %")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-onnx", dest="onnx", action="store_false", help="skip the onnxruntime peer")
    parser.add_argument("--onnx-only", action="store_true", help="only the onnxruntime comparison (fp32 and int8)")
    parser.add_argument("--profile", action="store_true",
                        help="only the per-op CPU profile of one batch, OASR fp32 and onnxruntime fp32")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, peer = build()
    batches = make_batches(args.batches, args.batch_size)
    if args.profile:
        print(f"machine: {machine()}")
        profile_section(model, peer, batches[min(3, len(batches) - 1)], args.threads)
        return
    audio = sum(float(lens.sum()) for _, lens in batches) * FRAME_SECONDS
    if args.onnx_only:
        print(f"machine: {machine()}")
        onnx_section(model, peer, batches, audio, args.repeats, args.threads)
        return

    with torch.inference_mode():
        feats, lens = batches[0]
        ours, our_lens = model.forward_offline(feats, lens)
        theirs, their_lens = peer(feats, lens)
        assert torch.equal(our_lens, their_lens)
        err = max((ours[r, :n] - theirs[r, :n]).abs().max().item() for r, n in enumerate(our_lens.tolist()))
        model.forward_offline(*batches[-1])  # warm-up
        peer(*batches[-1])

        # per batch, the best of the repeats (a co-tenant only ever adds time), alternating the peers
        runs: dict[str, list[list[float]]] = {k: [[] for _ in batches] for k in ("oasr", "peer", "padded", "alone")}
        for _ in range(args.repeats):
            for i, (feats, lens) in enumerate(batches):
                runs["oasr"][i].append(timed(model.forward_offline, feats, lens))
                runs["peer"][i].append(timed(peer, feats, lens))
        # sequence packing: the most it could save is the padded work
        for _ in range(args.repeats):
            for i, (feats, lens) in enumerate(batches):
                runs["padded"][i].append(timed(model.forward_offline, feats, lens))
                runs["alone"][i].append(sum(timed(model.forward_offline, feats[r:r + 1, :n], lens[r:r + 1])
                                            for r, n in enumerate(lens.tolist())))
    best = {k: sum(min(ts) for ts in v) for k, v in runs.items()}

    real = sum(float(lens.sum()) for _, lens in batches)
    padded = sum(float(lens.max()) * len(lens) for _, lens in batches)
    o, p = best["oasr"], best["peer"]
    print(f"machine: {machine()}")
    print(f"model: 12 x d256 Conformer + CTC(5000), {sum(t.numel() for t in model.parameters()) / 1e6:.1f} M params; "
          f"{args.batches} batches x {args.batch_size}, {audio:.0f} s of audio; max |log-prob diff| vs peer {err:.2e}")
    print(f"oasr forward_offline : {audio / o:8.1f} audio s / s  ({o:.2f} s)")
    print(f"WeNet-style eager    : {audio / p:8.1f} audio s / s  ({p:.2f} s)")
    print(f"ratio (oasr / peer)  : {p / o:.2f}x")
    engine_seconds = engine_run(model, batches, args.batch_size, args.repeats)
    print(f"oasr Engine (audio -> features -> forward -> CTC greedy -> text): {audio / engine_seconds:8.1f} audio s / s "
          f"({engine_seconds:.2f} s); vs the peer's forward alone: {p / engine_seconds:.2f}x")
    pb, pa = best["padded"], best["alone"]
    print(f"packing bound: padding is {100 * (padded - real) / padded:.1f}% of frames; padded batches {pb:.2f} s, "
          f"the same rows alone (no padding work) {pa:.2f} s -> packing could save at most {100 * (pb - pa) / pb:.1f}%")
    if args.onnx:
        onnx_section(model, peer, batches, audio, args.repeats, args.threads)


if __name__ == "__main__":
    main()
