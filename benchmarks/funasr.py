"""Offline throughput of the OASR Paraformer against FunASR itself, at paraformer-large dimensions.

The model is built by FunASR's own registry with paraformer-large's shape (SANM encoder d=512,
50 blocks, 4 heads, FFN 2048, kernel 11; 16 decoder blocks; CifPredictorV2 with tail 0.45; vocab
8404; random weights) and saved as a ModelScope-style folder, which both sides load: OASR through its
converter, FunASR through ``AutoModel(model=DIR)``.  Input: ``--clips`` synthetic non-stationary clips
of 2–14 s, sorted by length (FunASR gets the same order, so its fixed-size batches are as tight as
OASR's length buckets).  FunASR runs ``AutoModel.generate(input=clips, batch_size=B)`` as its users run
it on a list of files; OASR runs ``Engine.transcribe`` with ``max_batch_size=B``.  Both run on one
intra-op thread; the peers alternate and each counts its best of ``--repeats`` runs (a co-tenant on a
shared machine only adds time).  The script first checks the two print the same text on most clips
(a random model has near-ties, so a few may differ).

OASR also runs with int8 weights (``EngineConfig(quantization="int8")``: per-channel int8 GEMMs, the
four-fifths of the time that is matrix work here).  Printed: audio seconds per wall second for each,
the ratios to FunASR, the text agreement, and the machine.

With ``--sherpa``, sherpa-onnx's ``OfflineRecognizer.from_paraformer`` runs FunASR's own ONNX export of
the same weights (``AutoModel.export(type="onnx")``, batches of the same size through
``decode_streams``); it computes its own features, so on a random model its text is not compared.

Usage: python benchmarks/funasr.py [--clips 20] [--batch-size 8] [--repeats 2] [--threads 1] [--sherpa]
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml
from _common import machine, synth

# this file is named like the peer's package: keep its folder off the path so ``import funasr`` finds FunASR
_HERE = str(Path(__file__).resolve().parent)
sys.path[:] = [p for p in sys.path if str(Path(p or ".").resolve()) != _HERE]

VOCAB = 8404
LARGE = {"d": 512, "heads": 4, "ffn": 2048, "enc": 50, "dec": 16, "kernel": 11, "tail": 0.45}


def _conf(vocab: int) -> dict:
    d = LARGE["d"]
    return {
        "model": "Paraformer",
        "model_conf": {"ctc_weight": 0.0, "predictor_weight": 1.0, "predictor_bias": 1, "sampling_ratio": 0.75},
        "encoder": "SANMEncoder",
        "encoder_conf": {"output_size": d, "attention_heads": LARGE["heads"], "linear_units": LARGE["ffn"],
                         "num_blocks": LARGE["enc"], "input_layer": "pe", "pos_enc_class": "SinusoidalPositionEncoder",
                         "normalize_before": True, "kernel_size": LARGE["kernel"], "sanm_shfit": 0,
                         "selfattention_layer_type": "sanm"},
        "decoder": "ParaformerSANMDecoder",
        "decoder_conf": {"attention_heads": LARGE["heads"], "linear_units": LARGE["ffn"], "num_blocks": LARGE["dec"],
                         "att_layer_num": LARGE["dec"], "kernel_size": LARGE["kernel"], "sanm_shfit": 0},
        "predictor": "CifPredictorV2",
        "predictor_conf": {"idim": d, "threshold": 1.0, "l_order": 1, "r_order": 1, "tail_threshold": LARGE["tail"]},
        "frontend": "WavFrontend",
        "frontend_conf": {"fs": 16000, "window": "hamming", "n_mels": 80, "frame_length": 25, "frame_shift": 10,
                          "lfr_m": 7, "lfr_n": 6, "dither": 0.0},
        "tokenizer": "CharTokenizer",
        "tokenizer_conf": {"unk_symbol": "<unk>", "split_with_space": True},
        "input_size": 560,
        "vocab_size": vocab,
    }


def build_large(path: Path, seed: int = 0) -> Path:
    """A paraformer-large-shaped FunASR folder with random weights (built once, then reused)."""
    if (path / "model.pt").is_file():
        return path
    from funasr.register import tables

    path.mkdir(parents=True, exist_ok=True)
    tokens = ["<blank>", "<s>", "</s>"] + [chr(0x4E00 + i) for i in range(VOCAB - 4)] + ["<unk>"]
    conf = _conf(len(tokens))
    torch.manual_seed(seed)
    kwargs = copy.deepcopy(conf)
    for key in ("model", "frontend", "frontend_conf", "tokenizer", "tokenizer_conf"):
        kwargs.pop(key)
    model_conf = kwargs.pop("model_conf")
    model = tables.model_classes["Paraformer"](**{**model_conf, **kwargs})
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # widen the random weights so the decoder does not emit one token everywhere
        for p in model.state_dict().values():
            if p.is_floating_point():
                p.add_(torch.randn(p.shape, generator=gen) * 0.02)
    torch.save(model.state_dict(), path / "model.pt")
    (path / "config.yaml").write_text(yaml.safe_dump(conf, allow_unicode=True, sort_keys=False))
    (path / "tokens.json").write_text(json.dumps(tokens, ensure_ascii=False))
    (path / "configuration.json").write_text(json.dumps({"framework": "pytorch", "file_path_metas": {
        "init_param": "model.pt", "config": "config.yaml", "tokenizer_conf": {"token_list": "tokens.json"},
        "frontend_conf": {"cmvn_file": "am.mvn"}}}))
    dim = 560
    shift = " ".join(["-8.0"] * dim)
    scale = " ".join(["0.25"] * dim)
    (path / "am.mvn").write_text(f"<Nnet>\n<AddShift> {dim} {dim}\n<LearnRateCoef> 0 [ {shift} ]\n"
                                 f"<Rescale> {dim} {dim}\n<LearnRateCoef> 0 [ {scale} ]\n</Nnet>\n")
    return path


def sherpa_recognizer(path: Path, threads: int):
    """sherpa-onnx's ``OfflineRecognizer.from_paraformer`` on FunASR's own ONNX export of the same weights
    (exported once; the LFR / CMVN metadata sherpa-onnx reads is added to the file)."""
    import onnx
    import sherpa_onnx

    from oasr_models_funasr.convert import read_am_mvn

    model = path / "model.meta.onnx"
    if not model.is_file():
        from funasr import AutoModel

        export = torch.onnx.export

        def legacy_export(*args, **kwargs):  # FunASR's export is written for the TorchScript exporter
            kwargs.setdefault("dynamo", False)
            return export(*args, **kwargs)

        torch.onnx.export = legacy_export
        try:
            AutoModel(model=str(path), disable_update=True, device="cpu", disable_log=True).export(type="onnx",
                                                                                                  quantize=False)
        finally:
            torch.onnx.export = export
        proto = onnx.load(str(path / "model.onnx"))
        shift, scale = read_am_mvn(path / "am.mvn")
        meta = {"vocab_size": str(VOCAB), "lfr_window_size": "7", "lfr_window_shift": "6",
                "neg_mean": ",".join(f"{-v:.8g}" for v in shift.tolist()),
                "inv_stddev": ",".join(f"{v:.8g}" for v in scale.tolist())}
        for key, value in meta.items():
            entry = proto.metadata_props.add()
            entry.key, entry.value = key, value
        onnx.save(proto, str(model))
        tokens = json.loads((path / "tokens.json").read_text())
        (path / "tokens.txt").write_text("".join(f"{t} {i}\n" for i, t in enumerate(tokens)))
    return sherpa_onnx.OfflineRecognizer.from_paraformer(paraformer=str(model), tokens=str(path / "tokens.txt"),
                                                         num_threads=threads, sample_rate=16000, feature_dim=80,
                                                         decoding_method="greedy_search")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clips", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--check", type=int, default=6, help="clips FunASR also decodes one at a time")
    parser.add_argument("--sherpa", action="store_true",
                        help="also run sherpa-onnx on FunASR's ONNX export (pip install sherpa-onnx onnx)")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "oasr-bench-paraformer-large")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    logging.getLogger().setLevel(logging.ERROR)

    from funasr import AutoModel

    import oasr

    path = build_large(args.dir)
    clips = sorted((synth(2 + (i * 7919 % 1200) / 100, seed=i) for i in range(args.clips)), key=len)
    seconds = sum(len(c) for c in clips) / 16000
    # FunASR sets torch's thread count from its ``ncpu`` option (default 4)
    ref = AutoModel(model=str(path), disable_update=True, device="cpu", disable_pbar=True, disable_log=True,
                    ncpu=args.threads)
    torch.set_num_threads(args.threads)
    common = dict(model=str(path), max_batch_size=args.batch_size, max_wait_time=0.0)
    engine = oasr.Engine(oasr.EngineConfig(**common))
    engine_int8 = oasr.Engine(oasr.EngineConfig(**common, quantization="int8"))
    params = sum(p.numel() for p in engine.model.parameters()) / 1e6

    runs = {
        "funasr": lambda: [r["text"] for r in ref.generate(input=list(clips), batch_size=args.batch_size)],
        "oasr": lambda: engine.transcribe(list(clips)),
        "oasr_int8": lambda: engine_int8.transcribe(list(clips)),
    }
    if args.sherpa:
        recognizer = sherpa_recognizer(path, args.threads)
        torch.set_num_threads(args.threads)

        def run_sherpa():
            out = []
            for start in range(0, len(clips), args.batch_size):
                streams = []
                for clip in clips[start:start + args.batch_size]:
                    stream = recognizer.create_stream()
                    stream.accept_waveform(16000, clip)
                    streams.append(stream)
                recognizer.decode_streams(streams)
                out += [st.result.text for st in streams]
            return out

        runs["sherpa"] = run_sherpa
    texts = {name: fn() for name, fn in runs.items()}  # warm-up, and the agreement checks
    # FunASR's batched predictor reads padded encoder frames, so its batched text depends on the batch:
    # the agreement that matters is with each clip decoded alone
    check = min(args.check, len(clips))
    alone = [ref.generate(input=[c], batch_size=1)[0]["text"] for c in clips[:check]]
    same_alone = sum(a == b for a, b in zip(texts["oasr"][:check], alone, strict=True))
    same_batched = sum(a == b for a, b in zip(texts["oasr"], texts["funasr"], strict=True))
    same_int8 = sum(a == b for a, b in zip(texts["oasr"], texts["oasr_int8"], strict=True))
    print(f"model: paraformer-large shape, {params:.1f} M parameters; {args.clips} clips, {seconds:.1f} s of audio, "
          f"batch {args.batch_size}, {args.threads} thread(s)")
    print(f"same text as FunASR one clip at a time: {same_alone}/{check}; as FunASR batched: "
          f"{same_batched}/{len(clips)}; int8 as fp32: {same_int8}/{len(clips)}")
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(args.repeats):
        for name, fn in runs.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    rate = {k: seconds / v for k, v in best.items()}
    labels = [("oasr", "OASR fp32"), ("oasr_int8", "OASR int8"), ("funasr", "FunASR"), ("sherpa", "sherpa-onnx")]
    for name, label in labels:
        if name not in rate:
            continue
        print(f"{label:10s} {rate[name]:7.2f} audio s / s  ({best[name]:.2f} s)  "
              f"{rate[name] / rate['funasr']:.2f}x FunASR")
    print(f"machine: {machine()}; load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
