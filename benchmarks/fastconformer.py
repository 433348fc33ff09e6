"""Parakeet CTC offline throughput: OASR's ``parakeet_ctc`` vs transformers' ``ParakeetForCTC``, in one process.

A random Parakeet CTC of parakeet-ctc-110m's dimensions (FastConformer: 17 layers, hidden 512, 8 heads,
feed-forward 2048, depthwise kernel 9, 8x subsampling with 256 channels, 80 mels; vocabulary 1024 + blank)
is built and saved by transformers with its processor; OASR loads the same directory.  Both transcribe the
same ``--clips`` non-stationary clips of 2 to 12 s (mixed lengths), greedily:

- OASR: ``Engine.transcribe_outputs`` (features, encoder, CTC search, detokenizer), all clips at once
  (length-bucketed batches of up to ``--batch`` clips) and one clip per call;
- transformers: ``ParakeetProcessor`` + ``generate()`` + ``batch_decode``, batches of ``--batch`` clips in
  the same length order (padded, with the attention mask) and one clip per call.

One intra-op thread each; the systems take turns for ``--repeats`` rounds (one clip per call: clip by clip,
alternating) and each keeps its best.  Prints
seconds, the real-time factor and transformers' time over OASR's per mode, the share of clips whose token
ids agree, and the machine.  sherpa-onnx on NeMo's ONNX export (issue 16's third peer) is not run here.
Usage: ``python benchmarks/fastconformer.py [--clips 20] [--batch 8] [--repeats 2]``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from _common import machine, synth  # noqa: E402

torch.set_num_threads(1)
ENCODER = dict(hidden_size=512, num_hidden_layers=17, num_attention_heads=8, intermediate_size=2048,
               conv_kernel_size=9, subsampling_conv_channels=256, num_mel_bins=80, dropout=0.0, layerdrop=0.0,
               activation_dropout=0.0, attention_dropout=0.0)
PIECES = 1024


def build(root: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import (
        ParakeetCTCConfig,
        ParakeetFeatureExtractor,
        ParakeetForCTC,
        ParakeetProcessor,
        ParakeetTokenizer,
    )

    pieces = [("<unk>", 0.0)] + [(f"▁w{i}", -1.0 - i * 1e-3) for i in range(1, PIECES)]
    backend = Tokenizer(models.Unigram(pieces, unk_id=0))
    backend.pre_tokenizer, backend.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    tokenizer = ParakeetTokenizer(tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>")
    torch.manual_seed(0)
    model = ParakeetForCTC(ParakeetCTCConfig(vocab_size=PIECES + 1, pad_token_id=PIECES,
                                             encoder_config=ENCODER)).eval()
    with torch.no_grad():  # like a trained model, most frames are blank
        model.ctc_head.bias[PIECES] += 4.0
    model.save_pretrained(root)
    ParakeetProcessor(ParakeetFeatureExtractor(feature_size=80), tokenizer).save_pretrained(root)
    return root


def run_oasr(engine, clips, alone: bool):
    if alone:
        return [engine.transcribe_outputs(c).tokens for c in clips]
    return [o.tokens for o in engine.transcribe_outputs(list(clips))]


def run_hf(model, processor, clips, batch: int):
    out = []
    for i in range(0, len(clips), batch):
        inputs = processor(clips[i:i + batch], sampling_rate=16000, return_tensors="pt")
        with torch.no_grad():
            ids = model.generate(**inputs)
        processor.batch_decode(ids, skip_special_tokens=True)
        blank = model.config.pad_token_id
        for row in ids.tolist():
            tokens, prev = [], None
            for t in row:
                if t != prev and t != blank:
                    tokens.append(t)
                prev = t
            out.append(tokens)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clips", type=int, default=20)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")

    from transformers import AutoProcessor, ParakeetForCTC

    from oasr.checkpoints.loading import load_pretrained
    from oasr.engine import Engine, EngineConfig

    lengths = [2.0 + 10.0 * ((i * 7) % args.clips) / max(args.clips - 1, 1) for i in range(args.clips)]
    clips = [synth(s, seed=i) for i, s in enumerate(lengths)]
    by_length = sorted(clips, key=len)
    audio_seconds = sum(len(c) for c in clips) / 16000
    with tempfile.TemporaryDirectory() as tmp:
        root = build(Path(tmp) / "parakeet")
        hf = ParakeetForCTC.from_pretrained(root).eval()
        processor = AutoProcessor.from_pretrained(root)
        loaded = load_pretrained(root)
        batched = Engine(EngineConfig(max_batch_size=args.batch, max_pad_ratio=10.0), loaded=loaded)
        single = Engine(EngineConfig(max_batch_size=1), loaded=loaded)
        systems = {
            ("OASR", "batched"): lambda: run_oasr(batched, by_length, alone=False),
            ("transformers", "batched"): lambda: run_hf(hf, processor, by_length, args.batch),
        }
        best: dict = {}
        tokens: dict = {}
        for _ in range(args.repeats):
            for key, fn in systems.items():
                t0 = time.perf_counter()
                tokens[key] = fn()
                best[key] = min(best.get(key, float("inf")), time.perf_counter() - t0)
            # one clip per call: the two systems alternate clip by clip, so a co-tenant's load falls on both
            spent = {"OASR": 0.0, "transformers": 0.0}
            alone = {"OASR": [], "transformers": []}
            for clip in by_length:
                for system, fn in (("OASR", lambda c: run_oasr(single, [c], alone=True)),
                                   ("transformers", lambda c: run_hf(hf, processor, [c], 1))):
                    t0 = time.perf_counter()
                    alone[system] += fn(clip)
                    spent[system] += time.perf_counter() - t0
            for system in spent:
                tokens[(system, "alone")] = alone[system]
                best[(system, "alone")] = min(best.get((system, "alone"), float("inf")), spent[system])
    print(f"Parakeet CTC 110M-sized (random weights), {args.clips} clips, {audio_seconds:.1f} s of audio, "
          f"batches of {args.batch}; best of {args.repeats}")
    print(f"{'system':<14}{'mode':<10}{'seconds':>10}{'RTF':>10}{'transformers / OASR':>22}")
    for (system, mode), seconds in best.items():
        ratio = best[("transformers", mode)] / best[("OASR", mode)]
        print(f"{system:<14}{mode:<10}{seconds:>10.2f}{seconds / audio_seconds:>10.4f}"
              f"{(f'{ratio:.2f}x' if system == 'OASR' else ''):>22}")
    for mode in ("batched", "alone"):
        same = sum(a == b for a, b in zip(tokens[("OASR", mode)], tokens[("transformers", mode)], strict=True))
        print(f"token ids equal ({mode}): {same}/{args.clips} clips")
    print(f"machine: {machine()}")


if __name__ == "__main__":
    main()
