"""Kaldi fbank throughput: oasr's batched frontend vs kaldi-native-fbank vs torchaudio's Kaldi code.

All three run in this process, one thread each, on the same batch (default 32 × 10 s of synthetic
speech-like audio at 16 kHz, 80 mel bins, povey window, snip_edges, dither 0), and their outputs are
checked against each other before timing.  Prints seconds of audio per second of compute, the ratios,
and the machine.

kaldi-native-fbank is timed two ways: as a Python caller uses it (``accept_waveform`` of a list that was
converted beforehand, ``input_finished``, frames read back into numpy), and an estimate of its C++
compute alone, which subtracts the time the same calls take for ``OnlineRawAudioSamples`` (pybind's
list → vector conversion and framing copies, no FFT or mel work).  The oasr target is >= 3× the latter.

Usage: python benchmarks/features.py [--batch 32] [--seconds 10] [--repeats 5]
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np
import torch
from _common import cpu_model


def _speech_like(batch: int, samples: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    t = torch.arange(samples, dtype=torch.float64) / 16000
    rows = []
    for i in range(batch):
        chirp = 0.25 * torch.sin(2 * torch.pi * (100 + 150 * (i + 1) * t / t[-1]) * t * (1 + i % 5))
        am = 0.2 * torch.sin(2 * torch.pi * (500 + 97 * i) * t) * (0.5 + 0.5 * torch.sin(2 * torch.pi * 3 * t))
        noise = 0.05 * torch.randn(samples, generator=g, dtype=torch.float64)
        rows.append(chirp + am + noise)
    x = torch.stack(rows)
    return (x / (x.abs().amax(1, keepdim=True) * 1.25)).float()


def _best_of(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)

    import kaldi_native_fbank as knf
    import torchaudio
    import torchaudio.compliance.kaldi as ta_kaldi

    from oasr.features import FeatureConfig, extract_features_batch

    scale = 32768.0
    samples = int(args.seconds * 16000)
    audio = _speech_like(args.batch, samples)
    scaled = audio * scale
    lists = [row.tolist() for row in scaled]
    total_seconds = args.batch * args.seconds
    config = FeatureConfig(num_mel_bins=80, audio_scale=scale)

    opts = knf.FbankOptions()
    opts.frame_opts.dither = 0.0
    opts.frame_opts.snip_edges = True
    opts.mel_opts.num_bins = 80
    raw_opts = knf.RawAudioSamplesOptions()

    def run_oasr():
        return extract_features_batch(audio, config)

    def run_knf():
        out = []
        for row in lists:
            fbank = knf.OnlineFbank(opts)
            fbank.accept_waveform(16000, row)
            fbank.input_finished()
            out.append(np.stack([fbank.get_frame(i) for i in range(fbank.num_frames_ready)]))
        return out

    def run_knf_baseline():
        for row in lists:
            raw = knf.OnlineRawAudioSamples(raw_opts)
            raw.accept_waveform(16000, row)
            raw.input_finished()
            for i in range(raw.num_frames_ready):
                raw.get_frame(i)

    def run_torchaudio():
        return [ta_kaldi.fbank(row[None], num_mel_bins=80, dither=0.0, energy_floor=0.0) for row in scaled]

    # the three agree before anything is timed
    ours, _ = run_oasr()
    ta_out = run_torchaudio()
    knf_out = run_knf()
    for i in range(args.batch):
        ref = ta_out[i].double()
        weight = ref.exp().sum(-1, keepdim=True) / ref.exp()
        for other in (ours[i].double(), torch.from_numpy(knf_out[i]).double()):
            assert other.shape == ref.shape
            assert ((other - ref).abs() <= 2e-4 + 5e-5 * weight).all(), "outputs disagree"

    t_oasr = _best_of(run_oasr, args.repeats)
    t_ta = _best_of(run_torchaudio, args.repeats)
    t_knf = _best_of(run_knf, args.repeats)
    t_base = _best_of(run_knf_baseline, args.repeats)
    t_knf_compute = max(t_knf - t_base, 1e-9)

    rate = {name: total_seconds / t for name, t in [("oasr", t_oasr), ("torchaudio", t_ta), ("knf", t_knf),
                                                     ("knf_compute", t_knf_compute)]}
    print(f"machine: {cpu_model()} ({platform.machine()}, {platform.system()}), torch {torch.__version__} "
          f"(1 thread, MKL {torch.backends.mkl.is_available()}), torchaudio {torchaudio.__version__}, "
          f"kaldi-native-fbank {getattr(knf, '__version__', '?')}, python {platform.python_version()}")
    print(f"batch: {args.batch} x {args.seconds:g} s at 16 kHz = {total_seconds:g} s of audio; 80-bin povey fbank, "
          f"snip_edges, dither 0; best of {args.repeats}")
    print(f"{'implementation':44s} {'seconds':>9s} {'audio s / s':>12s} {'oasr speed-up':>14s}")
    rows = [("oasr kaldi_fbank (batched)", t_oasr), ("torchaudio.compliance.kaldi.fbank (per row)", t_ta),
            ("kaldi-native-fbank from Python (per row)", t_knf),
            ("kaldi-native-fbank compute (estimate)", t_knf_compute)]
    for name, t in rows:
        print(f"{name:44s} {t:9.4f} {total_seconds / t:12.0f} {t / t_oasr:13.2f}x")
    target = rate["oasr"] / rate["knf_compute"]
    print(f"target >= 3x kaldi-native-fbank compute per thread: {target:.2f}x -> "
          f"{'met' if target >= 3 else 'MISSED'}")


if __name__ == "__main__":
    main()
