"""Parakeet CTC / TDT offline (OASR vs transformers vs sherpa-onnx on NeMo's ONNX export) and Nemotron streaming.

NeMo itself (its own venv, ``.cache/nemo-venv``, through ``benchmarks/fastconformer_nemo.py``) builds a random
FastConformer of parakeet-ctc-110m's dimensions (17 × 512, 8 heads, FF 2048, depthwise kernel 9, 8× subsampling
with 256 channels, 80 mels, SentencePiece vocabulary 1024 + blank), as CTC and as TDT (parakeet-tdt_ctc-110m's
transducer: 2-layer LSTM predictor 640, joint 640, durations 0..4), ``save_to()``s the ``.nemo`` archive and
exports NeMo's ONNX graphs of the same weights.  The three systems then run the same weights:

- OASR loads the ``.nemo`` archive: ``Engine.transcribe_outputs`` (features, encoder, greedy search,
  detokenizer), all clips at once (length-bucketed batches of up to ``--batch``) and one clip per call;
- transformers: ``ParakeetForCTC`` / ``ParakeetForTDT`` built from the same dimensions, holding the archive's
  weights under transformers' names (OASR's ``.nemo`` converter renames them; the load is strict), with
  ``ParakeetFeatureExtractor`` + ``generate()`` + ``batch_decode``, padded batches of ``--batch`` in the same
  length order, and one clip per call;
- sherpa-onnx (onnxruntime) on NeMo's ONNX export with sherpa-onnx's NeMo metadata: ``OfflineRecognizer``
  ``from_nemo_ctc`` / ``from_transducer(model_type="nemo_transducer")``, ``decode_streams`` over batches of
  ``--batch`` streams, and ``decode_stream`` one clip per call.

Each system computes its own features from the audio.  One intra-op thread each; ``--repeats`` rounds, the
systems take turns (one clip per call: clip by clip, rotating), each keeps its best.  Prints seconds (wall, and
this process's CPU time: what a co-tenant on a shared box disturbs least), the real-time factor and each peer's time over OASR's per mode, the share of clips whose token ids equal OASR's per
peer (the check that all three hold the same weights), and the machine.  ``--work DIR`` keeps NeMo's models
between runs (built once, about 1.5 min each).  Needs ``onnx`` in the NeMo venv
(``.cache/nemo-venv/bin/pip install onnx``) and ``sherpa-onnx`` in this one (``pip install sherpa-onnx``).
``--model streaming``: NeMo builds a random cache-aware FastConformer RNN-T of the same encoder dimensions (left
context 70 frames, chunks of 7 frames = 560 ms; LSTM 2 × 640), ``save_to()``s it and exports its cache-aware
encoder (NeMo's cache support) with decoder and joint and sherpa-onnx's online NeMo metadata.  OASR's streaming
engine runs the ``.nemo`` over ``--streams`` concurrent streams fed 560 ms at a time round-robin; transformers'
``NemotronAsrStreamingForRNNT`` holding the same weights runs its cache-aware encoder chunk by chunk (encoder
only); sherpa-onnx's ``OnlineRecognizer`` (online NeMo transducer, one thread) runs the export over as many
streams fed the same way, the ready ones decoded together.  Prints process CPU seconds, streams per core
(audio seconds / CPU seconds) and each peer's time over OASR's, the weights check (transformers' and the ONNX
encoder's outputs against OASR's on OASR's features) and sherpa-onnx's token agreement with OASR.
Usage: ``python benchmarks/fastconformer.py [--model ctc,tdt,streaming] [--clips 20] [--batch 8] [--repeats 2]
[--streams 8] [--work DIR]``.
"""

from __future__ import annotations

import argparse
import difflib
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from _common import machine, synth  # noqa: E402

torch.set_num_threads(1)
HERE = Path(__file__).resolve().parent
NEMO_PYTHON = Path(os.environ.get("OASR_NEMO_PYTHON", HERE.parent / ".cache" / "nemo-venv" / "bin" / "python"))
SYSTEMS = ("OASR", "transformers", "sherpa-onnx")


def nemo_model(kind: str, root: Path) -> Path:
    """NeMo's random ``kind`` model (``.nemo`` + ONNX export) under ``root/kind``, built once."""
    out = root / kind
    if not (out / "model.nemo").is_file() or not (out / "tokens.txt").is_file():
        out.mkdir(parents=True, exist_ok=True)
        subprocess.run([str(NEMO_PYTHON), str(HERE / "fastconformer_nemo.py"), kind, str(out)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ, OMP_NUM_THREADS="1"))
    return out


def hf_model(kind: str, out: Path, loaded):
    """transformers' model of ``kind`` with the archive's weights (strict load) and its processor."""
    import transformers as tf
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from oasr_models_hf.fastconformer.nemo_convert import NemoCtcConverter, NemoTdtConverter

    cfg = loaded.model.config
    encoder = dict(hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_hidden_layers,
                   num_attention_heads=cfg.num_attention_heads, intermediate_size=cfg.intermediate_size,
                   conv_kernel_size=cfg.conv_kernel_size, subsampling_conv_channels=cfg.subsampling_conv_channels,
                   num_mel_bins=cfg.num_mel_bins, scale_input=cfg.scale_input, dropout=0.0, layerdrop=0.0,
                   activation_dropout=0.0, attention_dropout=0.0)
    vocab = cfg.vocab_size
    if kind == "ctc":
        model = tf.ParakeetForCTC(tf.ParakeetCTCConfig(vocab_size=vocab, pad_token_id=vocab - 1,
                                                       encoder_config=encoder))
        state = NemoCtcConverter().load_state_dict(out / "model.nemo")
    else:
        model = tf.ParakeetForTDT(tf.ParakeetTDTConfig(
            vocab_size=vocab, blank_token_id=vocab - 1, pad_token_id=vocab - 1,
            decoder_hidden_size=cfg.decoder_hidden_size, num_decoder_layers=2, max_symbols_per_step=10,
            durations=list(cfg.tdt_durations), encoder_config=encoder))
        model.generation_config.decoder_start_token_id = vocab - 1
        state = NemoTdtConverter().load_state_dict(out / "model.nemo")
        # the converter's names are OASR's, whose joint holds transformers' two projectors
        moved = {"joint.encoder_projector.": "encoder_projector.", "joint.decoder_projector.": "decoder.decoder_projector."}
        state = {next((new + k[len(old):] for old, new in moved.items() if k.startswith(old)), k): v
                 for k, v in state.items()}
    own = model.state_dict()
    state = {k: v for k, v in state.items() if k in own or not k.startswith("preprocessor.")}
    model.load_state_dict(state, strict=True)
    pieces = [line.rsplit(" ", 1)[0] for line in (out / "tokens.txt").read_text().splitlines()]
    backend = Tokenizer(models.Unigram([(p, -1.0) for p in pieces], unk_id=0))
    backend.pre_tokenizer, backend.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    tokenizer = tf.ParakeetTokenizer(tokenizer_object=backend, unk_token=pieces[0], pad_token=pieces[-1])
    processor = tf.ParakeetProcessor(tf.ParakeetFeatureExtractor(feature_size=cfg.num_mel_bins), tokenizer)
    return model.eval(), processor


def sherpa_model(kind: str, out: Path):
    import sherpa_onnx

    tokens = str(out / "tokens.txt")
    common = dict(tokens=tokens, num_threads=1, sample_rate=16000, feature_dim=80, decoding_method="greedy_search")
    if kind == "ctc":
        return sherpa_onnx.OfflineRecognizer.from_nemo_ctc(model=str(out / "model.onnx"), **common)
    return sherpa_onnx.OfflineRecognizer.from_transducer(
        encoder=str(out / "encoder.onnx"), decoder=str(out / "decoder.onnx"), joiner=str(out / "joiner.onnx"),
        model_type="nemo_transducer", **common)


def run_oasr(engine, clips):
    return [o.tokens for o in engine.transcribe_outputs(list(clips))]


def run_hf(kind: str, model, processor, clips, batch: int):
    blank = model.config.pad_token_id
    out = []
    for i in range(0, len(clips), batch):
        inputs = processor(clips[i:i + batch], sampling_rate=16000, return_tensors="pt")
        extra = {}
        if kind != "ctc":  # room for every label: transformers' TDT generate() has no per-frame limit
            frames = int(model.encoder._get_subsampling_output_length(inputs.attention_mask.sum(-1)).max())
            extra = dict(max_new_tokens=(model.config.max_symbols_per_step + 1) * frames + 2)
        with torch.no_grad():
            ids = model.generate(**inputs, **extra)
        sequences = ids.sequences if hasattr(ids, "sequences") else ids
        processor.batch_decode(sequences, skip_special_tokens=True)
        for row in sequences.tolist():
            if kind == "ctc":
                row = [t for j, t in enumerate(row) if j == 0 or t != row[j - 1]]
            out.append([t for t in (row if kind == "ctc" else row[1:]) if t != blank])
    return out


def run_sherpa(recognizer, ids: dict, clips, batch: int):
    out = []
    for i in range(0, len(clips), batch):
        streams = []
        for clip in clips[i:i + batch]:
            stream = recognizer.create_stream()
            stream.accept_waveform(16000, clip)
            streams.append(stream)
        if len(streams) == 1:
            recognizer.decode_stream(streams[0])
        else:
            recognizer.decode_streams(streams)
        out += [[ids[t] for t in s.result.tokens] for s in streams]
    return out


def same_weights(kind: str, out: Path, loaded, clips) -> str:
    """NeMo's ONNX export (onnxruntime) against OASR's encoder on OASR's own features of each clip: the check
    that sherpa-onnx's graph holds the archive's weights (sherpa-onnx itself computes other features)."""
    import onnxruntime as ort

    from oasr.features import FeatureConfig, extract_features_batch

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(out / ("model.onnx" if kind == "ctc" else "encoder.onnx")), options)
    names = [i.name for i in session.get_inputs()]
    worst = 0.0
    for clip in clips:
        feats, lens = extract_features_batch([torch.from_numpy(clip)], FeatureConfig.from_spec(loaded.feature_spec))
        with torch.no_grad():
            ours, _ = loaded.model.encoder(feats, lens)
            if kind == "ctc":
                ours = loaded.model.ctc_head(ours).log_softmax(-1)
        theirs = torch.from_numpy(session.run(None, {names[0]: feats.transpose(1, 2).numpy(),
                                                     names[1]: lens.numpy()})[0])
        theirs = theirs if kind == "ctc" else theirs.transpose(1, 2)
        worst = max(worst, float((ours - theirs).abs().max() / theirs.abs().max()))
    what = "CTC log-probs" if kind == "ctc" else "encoder output"
    return f"NeMo's ONNX export vs OASR on OASR's features ({len(clips)} clips): {what} max relative error {worst:.1e}"


def measure(kind: str, out: Path, clips, args) -> tuple[dict, dict]:
    from oasr.checkpoints.loading import load_pretrained
    from oasr.engine import Engine, EngineConfig

    loaded = load_pretrained(out / "model.nemo")
    print(same_weights(kind, out, loaded, clips[:4]))
    hf, processor = hf_model(kind, out, loaded)
    recognizer = sherpa_model(kind, out)
    # sherpa-onnx reports each piece's text, its word-start mark as a space
    ids = {line.rsplit(" ", 1)[0].replace("\u2581", " "): int(line.rsplit(" ", 1)[1])
           for line in (out / "tokens.txt").read_text().splitlines()}
    batched = Engine(EngineConfig(max_batch_size=args.batch, max_pad_ratio=10.0), loaded=loaded)
    single = Engine(EngineConfig(max_batch_size=1), loaded=loaded)
    by_length = sorted(clips, key=len)
    runs = {
        "OASR": (lambda cs: run_oasr(batched, cs), lambda c: run_oasr(single, [c])),
        "transformers": (lambda cs: run_hf(kind, hf, processor, cs, args.batch),
                         lambda c: run_hf(kind, hf, processor, [c], 1)),
        "sherpa-onnx": (lambda cs: run_sherpa(recognizer, ids, cs, args.batch),
                        lambda c: run_sherpa(recognizer, ids, [c], 1)),
    }
    best: dict = {}  # (system, mode) -> wall seconds; (system, mode, "cpu") -> process CPU seconds
    tokens: dict = {}

    def keep(key, wall: float, cpu: float) -> None:
        best[key] = min(best.get(key, float("inf")), wall)
        best[key + ("cpu",)] = min(best.get(key + ("cpu",), float("inf")), cpu)

    for round_ in range(args.repeats):
        order = SYSTEMS[round_ % 3:] + SYSTEMS[:round_ % 3]
        for system in order:
            t0, c0 = time.perf_counter(), time.process_time()
            tokens[(system, "batched")] = runs[system][0](by_length)
            keep((system, "batched"), time.perf_counter() - t0, time.process_time() - c0)
        spent = {s: [0.0, 0.0] for s in SYSTEMS}
        alone: dict = {s: [] for s in SYSTEMS}
        for n, clip in enumerate(by_length):  # clip by clip, rotating, so a co-tenant's load falls on all three
            for system in SYSTEMS[n % 3:] + SYSTEMS[:n % 3]:
                t0, c0 = time.perf_counter(), time.process_time()
                alone[system] += runs[system][1](clip)
                spent[system][0] += time.perf_counter() - t0
                spent[system][1] += time.process_time() - c0
        for system in SYSTEMS:
            tokens[(system, "alone")] = alone[system]
            keep((system, "alone"), *spent[system])
    return best, tokens


#: torch profiler op names (OASR) and onnxruntime op types (NeMo's export) per op family of the profile table
FAMILIES = {
    "GEMM": ("mkldnn::_linear_pointwise", "mkl::_mkl_linear", "aten::addmm", "aten::mm", "aten::linear",
             "MatMul", "Gemm", "FusedMatMul", "MatMulNBits"),
    "attention core": ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::bmm", "aten::gather",
                       "aten::_softmax", "aten::baddbmm", "Softmax"),
    "convolutions": ("aten::mkldnn_convolution", "aten::_slow_conv2d_forward", "mkldnn::_convolution_pointwise",
                     "aten::_convolution", "Conv", "FusedConv"),
    "LayerNorm": ("aten::native_layer_norm", "LayerNormalization", "SkipLayerNormalization"),
    "copies, pads, cats": ("aten::copy_", "aten::cat", "aten::fill_", "aten::constant_pad_nd", "aten::zero_",
                           "aten::contiguous", "aten::clone", "Transpose", "Concat", "Pad", "Slice", "Gather",
                           "Expand", "Where", "Split"),
    "elementwise": ("aten::add", "aten::add_", "aten::mul", "aten::mul_", "aten::silu_", "aten::relu_",
                    "aten::glu", "aten::sigmoid", "aten::masked_fill", "aten::clamp_min_", "aten::sub", "Add", "Mul",
                    "Sigmoid", "Relu", "Div", "Sub", "Sqrt", "Pow", "ReduceMean", "Neg", "Exp", "Sin", "Cos",
                    "QuickGelu", "BiasAdd", "Erf", "Tanh", "Not", "Equal", "Less", "Cast", "And", "Or"),
}


def family(op: str) -> str:
    return next((name for name, ops in FAMILIES.items() if op in ops), "other")


def profile_encoders(kind: str, out: Path, clips, args) -> None:
    """Where the encoder's CPU time goes one clip per call, side by side on the same clips and OASR's features:
    OASR's encoder under torch.profiler (self CPU per op) and NeMo's ONNX export under onnxruntime's own profiler
    (``enable_profiling``: kernel time per op type), summed per op family (:data:`FAMILIES`; onnxruntime runs NeMo's
    pointwise convolutions as ``Conv``) over all clips, each clip run first; and the encoders' plain CPU time
    (best of ``--repeats``, unprofiled, alternating), which the profiles' shares are scaled to."""
    import collections
    import json

    import onnxruntime as ort
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from oasr.checkpoints.loading import load_pretrained
    from oasr.features import FeatureConfig, extract_features_batch

    loaded = load_pretrained(out / "model.nemo")
    encoder = loaded.model.encoder
    config = FeatureConfig.from_spec(loaded.feature_spec)
    inputs = [extract_features_batch([torch.from_numpy(c)], config) for c in clips]
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    plain = ort.InferenceSession(str(out / ("model.onnx" if kind == "ctc" else "encoder.onnx")), options)
    names = [i.name for i in plain.get_inputs()]
    feeds = [{names[0]: f.transpose(1, 2).contiguous().numpy(), names[1]: n.numpy()} for f, n in inputs]

    def oasr_all():
        with torch.inference_mode():
            for f, n in inputs:
                encoder(f, n)

    def ort_all(session):
        for feed in feeds:
            session.run(None, feed)

    oasr_all(), ort_all(plain)
    best = {"OASR": float("inf"), "onnxruntime": float("inf")}
    for round_ in range(args.repeats):
        for system in (("OASR", "onnxruntime") if round_ % 2 == 0 else ("onnxruntime", "OASR")):
            c0 = time.process_time()
            oasr_all() if system == "OASR" else ort_all(plain)
            best[system] = min(best[system], time.process_time() - c0)
    ours: collections.Counter = collections.Counter()
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        oasr_all()
    for event in prof.key_averages():
        ours[event.key] += event.self_cpu_time_total / 1e3
    with tempfile.TemporaryDirectory() as folder:
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(folder, "ort")
        session = ort.InferenceSession(str(out / ("model.onnx" if kind == "ctc" else "encoder.onnx")), options)
        ort_all(session), ort_all(session), ort_all(session)
        with open(session.end_profiling()) as f:
            events = json.load(f)
    runs = [e for e in events if e.get("name") == "model_run"][-len(feeds):]
    theirs: collections.Counter = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and \
                any(r["ts"] <= e["ts"] <= r["ts"] + r["dur"] for r in runs):
            theirs[e["args"]["op_name"]] += e["dur"] / 1e3
    frames = sum(int(n) for _, n in inputs)
    print(f"\n{kind.upper()} encoder, {len(clips)} clips one per call ({frames} feature frames), OASR's features; "
          f"unprofiled CPU s (best of {args.repeats}): OASR {best['OASR']:.2f}, onnxruntime {best['onnxruntime']:.2f}"
          f" (onnxruntime / OASR {best['onnxruntime'] / best['OASR']:.2f}x)")
    per_family = {side: collections.Counter() for side in ("OASR", "onnxruntime")}
    for side, ops in (("OASR", ours), ("onnxruntime", theirs)):
        for op, ms in ops.items():
            per_family[side][family(op)] += ms
    # a profiler's times are wall time per op (a loaded box inflates them): each family's share of its profile is
    # also given as CPU ms, the share of the unprofiled CPU time
    totals = {side: sum(per_family[side].values()) for side in per_family}
    print(f"{'op family':<22}{'OASR prof ms':>14}{'ORT prof ms':>13}{'OASR CPU ms':>13}{'ORT CPU ms':>12}"
          f"{'OASR - ORT':>12}")
    for name in (*FAMILIES, "other", "total"):
        a, b = ((totals["OASR"], totals["onnxruntime"]) if name == "total"
                else (per_family["OASR"][name], per_family["onnxruntime"][name]))
        ca, cb = 1e3 * best["OASR"] * a / totals["OASR"], 1e3 * best["onnxruntime"] * b / totals["onnxruntime"]
        print(f"{name:<22}{a:>14.0f}{b:>13.0f}{ca:>13.0f}{cb:>12.0f}{ca - cb:>12.0f}")
    for side, ops in (("OASR", ours), ("onnxruntime", theirs)):
        print(f"-- {side}: top ops: " + ", ".join(f"{op} {ms:.0f}" for op, ms in ops.most_common(14)))


#: the streaming model's audio piece fed per stream per round: 560 ms, one trained chunk
PIECE = 8960


def stream_oasr(path: Path, clips, piece: int) -> tuple[float, float, list]:
    """All clips as concurrent streams of one engine, fed ``piece`` samples at a time round-robin; (wall
    seconds, process CPU seconds, final token ids per clip)."""
    from oasr.engine import Engine, EngineConfig

    engine = Engine(EngineConfig(model=str(path), service_mode="streaming", max_streams=len(clips)))
    t0, c0 = time.perf_counter(), time.process_time()
    ids = [engine.add_streaming_request(request_id=f"s{i}") for i in range(len(clips))]
    pos, final = [0] * len(clips), {}
    while len(final) < len(clips):
        for i, clip in enumerate(clips):
            if pos[i] < clip.size:
                engine.feed_chunk(ids[i], clip[pos[i]:pos[i] + piece], is_last=pos[i] + piece >= clip.size)
                pos[i] += piece
        final.update({o.request_id: o.tokens for o in engine.step() if o.finished})
    return time.perf_counter() - t0, time.process_time() - c0, [final[i] for i in ids]


def hf_streaming(path: Path, loaded):
    """transformers' ``NemotronAsrStreamingForRNNT`` of the archive's dimensions holding its weights (OASR's
    converter names them; strict load) and transformers' feature extractor."""
    import transformers as tf

    from oasr_models_hf.fastconformer.nemo_convert import NemoRnntStreamingConverter

    cfg = loaded.model.config
    encoder = tf.NemotronAsrStreamingEncoderConfig(
        hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads, intermediate_size=cfg.intermediate_size,
        conv_kernel_size=cfg.conv_kernel_size, subsampling_conv_channels=cfg.subsampling_conv_channels,
        num_mel_bins=cfg.num_mel_bins, scale_input=cfg.scale_input, sliding_window=cfg.sliding_window,
        default_num_lookahead_tokens=cfg.num_lookahead_tokens, dropout=0.0, layerdrop=0.0,
        activation_dropout=0.0, attention_dropout=0.0)
    model = tf.NemotronAsrStreamingForRNNT(tf.NemotronAsrStreamingConfig(
        encoder_config=encoder, vocab_size=cfg.vocab_size, blank_token_id=cfg.blank_id, pad_token_id=cfg.blank_id,
        decoder_hidden_size=cfg.decoder_hidden_size, num_decoder_layers=cfg.num_decoder_layers,
        max_symbols_per_step=cfg.max_symbols_per_step))
    state = NemoRnntStreamingConverter().load_state_dict(path)
    # the converter's names are OASR's, whose joint holds transformers' two projectors
    moved = {"joint.encoder_projector.": "encoder_projector.", "joint.decoder_projector.": "decoder.decoder_projector."}
    state = {next((new + k[len(old):] for old, new in moved.items() if k.startswith(old)), k): v
             for k, v in state.items() if not k.startswith("preprocessor.")}
    model.load_state_dict(state, strict=True)
    return model.eval(), tf.NemotronAsrStreamingFeatureExtractor(feature_size=cfg.num_mel_bins)


def hf_encode_stream(hf, feats: torch.Tensor) -> torch.Tensor:
    """transformers' cache-aware encoder (its K/V and conv padding caches) over (T, mels) ``feats`` chunk by
    chunk, NeMo's framing (a first window of ``1 + factor · r`` frames, then ``factor · (r + 1)``); (T', hidden)."""
    from transformers.cache_utils import DynamicCache
    from transformers.models.nemotron_asr_streaming.modeling_nemotron_asr_streaming import (
        NemotronAsrStreamingEncoderCausalConvPaddingCache,
    )

    config = hf.config.encoder_config
    r, factor = config.default_num_lookahead_tokens, config.subsampling_factor
    cache, padding = DynamicCache(config=config), NemotronAsrStreamingEncoderCausalConvPaddingCache()
    bounds = [0, 1 + factor * r]
    while bounds[-1] + factor * (r + 1) <= feats.shape[0]:
        bounds.append(bounds[-1] + factor * (r + 1))
    outs = []
    with torch.no_grad():
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            out = hf.encoder(input_features=feats[None, a:b], cache=cache, padding_cache=padding, use_cache=True,
                             num_lookahead_tokens=r, output_attention_mask=False)
            outs.append(out.last_hidden_state[0])
    return torch.cat(outs)


def stream_hf(hf, extractor, clips) -> tuple[float, float]:
    """transformers' cache-aware encoder chunk by chunk, one stream after the other; features computed once per
    clip up front and no decoding (encoder only); (wall, process CPU) seconds."""
    t0, c0 = time.perf_counter(), time.process_time()
    for clip in clips:
        hf_encode_stream(hf, extractor(clip, sampling_rate=16000, return_tensors="pt").input_features[0])
    return time.perf_counter() - t0, time.process_time() - c0


def sherpa_online(out: Path):
    import sherpa_onnx

    return sherpa_onnx.OnlineRecognizer.from_transducer(
        tokens=str(out / "tokens.txt"), encoder=str(out / "encoder.onnx"), decoder=str(out / "decoder.onnx"),
        joiner=str(out / "joiner.onnx"), num_threads=1, sample_rate=16000, feature_dim=80,
        decoding_method="greedy_search")


def stream_sherpa(recognizer, ids: dict, clips, piece: int) -> tuple[float, float, list]:
    """sherpa-onnx's online NeMo transducer: one stream per clip fed ``piece`` samples at a time round-robin, the
    ready streams decoded together (``decode_streams``) after each round; each stream ends with 0.8 s of
    silence (sherpa-onnx decodes whole windows only: its examples pad the tail so).  (wall, process CPU
    seconds, token ids per clip)."""
    import numpy as np

    tail = np.zeros(12800, dtype=np.float32)
    t0, c0 = time.perf_counter(), time.process_time()
    streams = [recognizer.create_stream() for _ in clips]
    fed = [np.concatenate([clip, tail]) for clip in clips]
    pos = [0] * len(clips)
    while any(p < f.size for p, f in zip(pos, fed, strict=True)):
        for i, audio in enumerate(fed):
            if pos[i] < audio.size:
                streams[i].accept_waveform(16000, audio[pos[i]:pos[i] + piece])
                pos[i] += piece
                if pos[i] >= audio.size:
                    streams[i].input_finished()
        while ready := [s for s in streams if recognizer.is_ready(s)]:
            recognizer.decode_streams(ready)
    tokens = [[ids[t] for t in recognizer.get_result_all(s).tokens] for s in streams]
    return time.perf_counter() - t0, time.process_time() - c0, tokens


def onnx_stream_encoder(session, feats: torch.Tensor, window: int, shift: int) -> torch.Tensor:
    """NeMo's cache-aware ONNX encoder (onnxruntime) over (T, mels) ``feats`` as sherpa-onnx frames it:
    ``window`` frames a call (the pre-encode cache and the chunk) every ``shift``, caches carried; (T', hidden)."""
    import numpy as np

    meta = session.get_modelmeta().custom_metadata_map
    layers, hidden = int(meta["cache_last_channel_dim1"]), int(meta["cache_last_channel_dim3"])
    channel = np.zeros((1, layers, int(meta["cache_last_channel_dim2"]), hidden), dtype=np.float32)
    last_time = np.zeros((1, layers, hidden, int(meta["cache_last_time_dim3"])), dtype=np.float32)
    channel_len = np.zeros(1, dtype=np.int64)
    outs = []
    for start in range(0, feats.shape[0] - window + 1, shift):
        x = feats[start:start + window].T[None].contiguous().numpy()
        out, _, channel, last_time, channel_len = session.run(None, {
            "audio_signal": x, "length": np.array([window], dtype=np.int64), "cache_last_channel": channel,
            "cache_last_time": last_time, "cache_last_channel_len": channel_len})
        outs.append(torch.from_numpy(out[0].T))
    return torch.cat(outs)


def oasr_framed_as_sherpa(encoder, feats: torch.Tensor, drop: int) -> torch.Tensor:
    """OASR's offline encoder (the trained mask) over (T, mels) ``feats`` as the ONNX encoder sees them in
    sherpa-onnx's framing: the first window's pre-encode frames are context only and its first ``drop``
    subsampled frames are dropped, so the stream (its chunks, its left context) starts at subsampled frame
    ``drop``; (T' - drop, hidden)."""
    from oasr_models_hf.fastconformer.nemotron_encoder import AttentionLayout

    with torch.no_grad():
        x = encoder.subsampling(feats[None], None)[:, drop:] * encoder.input_scale
        frames = x.shape[1]
        layout = AttentionLayout(frames, torch.tensor([frames]), encoder.attention_chunk, encoder.left_chunks,
                                 encoder.offline_block_frames, encoder.config.hidden_size, x.dtype)
        for layer in encoder.layers:
            x = layer(x, layout, None)
    return x[0]


def sherpa_feature_gap(recognizer, loaded, clips) -> str:
    """How far sherpa-onnx's own features (its fbank with NeMo-like options) are from OASR's (= NeMo's)."""
    import numpy as np

    from oasr.features import FeatureConfig, extract_features_batch

    gaps = []
    for clip in clips:
        stream = recognizer.create_stream()
        stream.accept_waveform(16000, clip)
        stream.input_finished()
        feats, _ = extract_features_batch([torch.from_numpy(clip)], FeatureConfig.from_spec(loaded.feature_spec))
        n = len(clip) // 160 - 2
        theirs = np.reshape(stream.get_frames(0, n), (n, -1))
        gaps.append(float(np.abs(feats[0, :n].numpy() - theirs).mean()))
    return (f"sherpa-onnx's own features vs OASR's (NeMo's log-mel) ({len(clips)} clips): mean |difference| "
            f"{max(gaps):.2f} (log-mel units)")


def streaming_weights(out: Path, loaded, hf, clips) -> list[str]:
    """The same weights in all three, on OASR's features of each clip: transformers' cache-aware encoder chunk
    by chunk (NeMo's framing) against OASR's offline encoder (the trained mask; OASR's streaming equals it,
    tested), and NeMo's cache-aware ONNX export (onnxruntime) framed as sherpa-onnx frames it against OASR's
    encoder framed so too (:func:`oasr_framed_as_sherpa`)."""
    import onnxruntime as ort

    from oasr.features import FeatureConfig, extract_features_batch

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(out / "encoder.onnx"), options)
    meta = session.get_modelmeta().custom_metadata_map
    window, shift = int(meta["window_size"]), int(meta["chunk_shift"])
    factor = loaded.model.config.subsampling_factor
    drop = 1 + (window - shift - 1) // factor  # NeMo's drop_extra_pre_encoded for its pre-encode cache
    worst_hf = worst_onnx = 0.0
    for clip in clips:
        feats, lens = extract_features_batch([torch.from_numpy(clip)], FeatureConfig.from_spec(loaded.feature_spec))
        with torch.no_grad():
            ours = loaded.model.encode_offline(feats, lens)[0][0]
        theirs = hf_encode_stream(hf, feats[0])
        n = min(len(theirs), len(ours))
        worst_hf = max(worst_hf, float((ours[:n] - theirs[:n]).abs().max() / ours[:n].abs().max()))
        onnx = onnx_stream_encoder(session, feats[0], window, shift)
        ours = oasr_framed_as_sherpa(loaded.model.encoder, feats[0], drop)[:len(onnx)]
        worst_onnx = max(worst_onnx, float((ours - onnx).abs().max() / ours.abs().max()))
    return [f"transformers' cache-aware encoder vs OASR on OASR's features ({len(clips)} clips): max relative error "
            f"{worst_hf:.1e}",
            f"NeMo's cache-aware ONNX export (onnxruntime in sherpa-onnx's framing: {window}-frame windows every "
            f"{shift}, the first {drop} frames dropped) vs OASR framed so on OASR's features ({len(clips)} clips): "
            f"max relative error {worst_onnx:.1e}"]


def streaming(root: Path, args) -> None:
    from oasr.checkpoints.loading import load_pretrained

    out = nemo_model("streaming", root)
    path = out / "model.nemo"
    loaded = load_pretrained(path)
    hf, extractor = hf_streaming(path, loaded)
    recognizer = sherpa_online(out)
    ids = {line.rsplit(" ", 1)[0].replace("\u2581", " "): int(line.rsplit(" ", 1)[1])
           for line in (out / "tokens.txt").read_text().splitlines()}
    clips = [synth(6.0 + 4.0 * (i % 3), seed=100 + i) for i in range(args.streams)]
    for line in [*streaming_weights(out, loaded, hf, clips[:3]), sherpa_feature_gap(recognizer, loaded, clips[:3])]:
        print(line)
    audio_seconds = sum(len(c) for c in clips) / 16000
    best = {s: (float("inf"), float("inf")) for s in SYSTEMS}
    tokens = {}
    for round_ in range(args.repeats):
        for system in SYSTEMS[round_ % 3:] + SYSTEMS[:round_ % 3]:
            if system == "OASR":
                wall, cpu, tokens[system] = stream_oasr(path, clips, PIECE)
            elif system == "sherpa-onnx":
                wall, cpu, tokens[system] = stream_sherpa(recognizer, ids, clips, PIECE)
            else:
                wall, cpu = stream_hf(hf, extractor, clips)
            best[system] = min(best[system], (cpu, wall))
    print(f"\nNemotron-style cache-aware FastConformer RNN-T, 110M-sized (NeMo-built, random weights), "
          f"{args.streams} streams of 6-14 s ({audio_seconds:.1f} s of audio), chunks of 560 ms, best of {args.repeats}")
    print(f"{'system':<14}{'CPU s':>9}{'wall s':>9}{'streams/core':>14}{'peer / OASR (CPU)':>20}")
    for system, (cpu, wall) in best.items():
        ratio = f"{cpu / best['OASR'][0]:.2f}x" if system != "OASR" else ""
        print(f"{system:<14}{cpu:>9.2f}{wall:>9.2f}{audio_seconds / cpu:>14.2f}{ratio:>20}")
    print("OASR: engine streams (features, encoder, greedy transducer, partials); transformers: encoder only; "
          "sherpa-onnx: features, encoder, greedy transducer")
    print(f"token ids vs OASR (sherpa-onnx, its own features): {agreement(tokens['OASR'], tokens['sherpa-onnx'])}")
    print(f"OASR emitted {sum(len(t) for t in tokens['OASR'])} tokens over {args.streams} streams")


def agreement(ours: list, theirs: list) -> str:
    same = sum(a == b for a, b in zip(ours, theirs, strict=True))
    ratio = sum(difflib.SequenceMatcher(a=a, b=b).ratio() for a, b in zip(ours, theirs, strict=True)) / len(ours)
    return f"{same}/{len(ours)} clips equal, token similarity {ratio:.3f}"


def report(kind: str, best: dict, tokens: dict, args, audio_seconds: float) -> None:
    name = {"ctc": "Parakeet CTC", "tdt": "Parakeet TDT"}[kind]
    print(f"\n{name} 110M-sized (NeMo-built, random weights), {args.clips} clips, {audio_seconds:.1f} s of audio, "
          f"batches of {args.batch}; best of {args.repeats}")
    print(f"{'system':<14}{'mode':<10}{'seconds':>10}{'RTF':>10}{'peer / OASR':>14}{'CPU s':>10}{'CPU peer / OASR':>17}")
    for mode in ("batched", "alone"):
        for system in SYSTEMS:
            seconds, cpu = best[(system, mode)], best[(system, mode, "cpu")]
            ratio = f"{seconds / best[('OASR', mode)]:.2f}x" if system != "OASR" else ""
            cpu_ratio = f"{cpu / best[('OASR', mode, 'cpu')]:.2f}x" if system != "OASR" else ""
            print(f"{system:<14}{mode:<10}{seconds:>10.2f}{seconds / audio_seconds:>10.4f}{ratio:>14}"
                  f"{cpu:>10.2f}{cpu_ratio:>17}")
    for mode in ("batched", "alone"):
        for peer in SYSTEMS[1:]:
            print(f"token ids vs OASR ({mode}, {peer}): "
                  f"{agreement(tokens[('OASR', mode)], tokens[(peer, mode)])}")
    emitted = sum(len(t) for t in tokens[("OASR", "alone")])
    print(f"OASR emitted {emitted} tokens over {args.clips} clips")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="ctc,tdt,streaming", help="comma-separated: ctc, tdt, streaming")
    parser.add_argument("--streams", type=int, default=8, help="concurrent streams in the streaming run")
    parser.add_argument("--clips", type=int, default=20)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--work", type=Path, default=None, help="keep NeMo's models here between runs")
    parser.add_argument("--profile", action="store_true",
                        help="only the encoders' per-op-family CPU profile one clip per call (OASR, onnxruntime)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    if not NEMO_PYTHON.is_file():
        sys.exit(f"NeMo's venv is missing ({NEMO_PYTHON}): python -m venv .cache/nemo-venv && "
                 f".cache/nemo-venv/bin/pip install torch==2.13.0 'nemo_toolkit[asr]' onnx")
    lengths = [2.0 + 10.0 * ((i * 7) % args.clips) / max(args.clips - 1, 1) for i in range(args.clips)]
    clips = [synth(s, seed=i) for i, s in enumerate(lengths)]
    audio_seconds = sum(len(c) for c in clips) / 16000
    with tempfile.TemporaryDirectory() as tmp:
        root = args.work or Path(tmp)
        for kind in args.model.split(","):
            if kind == "streaming":
                streaming(root, args)
                continue
            if args.profile:
                profile_encoders(kind, nemo_model(kind, root), clips, args)
                continue
            best, tokens = measure(kind, nemo_model(kind, root), clips, args)
            report(kind, best, tokens, args, audio_seconds)
    print(f"machine: {machine()}")


if __name__ == "__main__":
    main()
