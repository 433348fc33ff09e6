"""CTC prefix beam search: oasr's numba kernel vs oasr's reference (pure Python) vs pyctcdecode.

All three run in this process, one thread, on the same batch (default 16 rows × 1000 frames, a
5000-token BPE-style vocabulary, beam 10, no language model).  The log-probs are synthetic but shaped
like a trained CTC model's: mostly confident blank frames, token frames with one likely token, a few
competitors and blank, the rest of the vocabulary far below (a 1-sigma spread of logits).

pyctcdecode needs a label per id: id 0 is the blank (``""``), the rest are ``▁w<i>`` (word starts)
and ``p<i>`` pieces.  It prunes tokens under ``token_min_logp`` (-5) per frame and beams more than
``beam_prune_logp`` (-10) below the best, its defaults; oasr's search is WeNet's (the top ``beam``
labels of every frame, no score pruning), so pyctcdecode is a speed peer, not an exact oracle.  The
kernel's n-best is checked equal to the reference's before timing; the share of rows where
pyctcdecode's best text equals oasr's best text is printed for information.

Usage: python benchmarks/ctc.py [--batch 16] [--frames 1000] [--vocab 5000] [--beam 10] [--repeats 3]
"""

from __future__ import annotations

import argparse
import logging
import os
import time
import warnings

import numpy as np
import torch
from _common import cpu_model


def synthetic_log_probs(batch: int, frames: int, vocab: int, seed: int = 0) -> torch.Tensor:
    """Peaky CTC-like posteriors: ~65% blank frames, token frames led by one token (log-probs float32)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, frames, vocab, generator=g)
    token_frame = torch.rand(batch, frames, generator=g) < 0.35
    truth = torch.randint(1, vocab, (batch, frames), generator=g)
    rivals = torch.randint(1, vocab, (batch, frames, 3), generator=g)
    rows, cols = torch.meshgrid(torch.arange(batch), torch.arange(frames), indexing="ij")
    logits[..., 0] += torch.where(token_frame, torch.tensor(9.0), torch.tensor(12.5))
    logits[rows, cols, truth] += torch.where(token_frame, torch.tensor(11.0), torch.tensor(6.0))
    for r in range(3):
        logits[rows, cols, rivals[..., r]] += torch.where(token_frame, torch.tensor(9.0 - r), torch.tensor(5.0))
    return logits.log_softmax(-1)


def labels_for(vocab: int) -> list[str]:
    return [""] + [f"▁w{i}" if i % 3 == 1 else f"p{i}" for i in range(1, vocab)]


def _best_of(fn, repeats: int, warmup: bool = True) -> tuple[float, object]:
    """Best time of ``repeats`` runs (after one untimed run when ``warmup``) and the last result."""
    if warmup:
        fn()
    times = []
    result = None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--frames", type=int, default=1000)
    parser.add_argument("--vocab", type=int, default=5000)
    parser.add_argument("--beam", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.pop("OASR_KERNELS", None)
    logging.getLogger("pyctcdecode").setLevel(logging.ERROR)

    from oasr.decoding.ctc import ReferencePrefixBeam, ctc_prefix_beam_search, hypotheses
    from oasr.layers._backend import kernel

    if kernel("ctc_prefix_beam_search") is None:
        raise SystemExit("oasr-kernels is not installed (or OASR_KERNELS=0): nothing to benchmark")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pyctcdecode import build_ctcdecoder

        decoder = build_ctcdecoder(labels_for(args.vocab))

    log_probs = synthetic_log_probs(args.batch, args.frames, args.vocab)
    lengths = torch.full((args.batch,), args.frames)
    numpy_rows = [row.numpy() for row in log_probs]
    blank_share = float((log_probs.argmax(-1) == 0).float().mean())

    def oasr_kernel():
        return ctc_prefix_beam_search(log_probs, lengths, beam_size=args.beam)

    def oasr_reference():
        out = []
        for row in log_probs:
            search = ReferencePrefixBeam(args.beam, 0)
            search.advance(row)
            out.append(hypotheses(search.nbest(args.beam)))
        return out

    def pyctc():
        return [decoder.decode_beams(row, beam_width=args.beam) for row in numpy_rows]

    t_kernel, kernel_out = _best_of(oasr_kernel, args.repeats)
    t_reference, reference_out = _best_of(oasr_reference, 1, warmup=False)
    for k_row, r_row in zip(kernel_out, reference_out, strict=True):
        assert [(h.tokens, h.token_frames) for h in k_row] == [(h.tokens, h.token_frames) for h in r_row]
        assert np.allclose([h.score for h in k_row], [h.score for h in r_row], rtol=1e-12, atol=0)
    t_pyctc, pyctc_out = _best_of(pyctc, 2, warmup=False)
    t_skip, _ = _best_of(lambda: ctc_prefix_beam_search(log_probs, lengths, beam_size=args.beam,
                                                        blank_skip_threshold=0.95), args.repeats)

    labels = labels_for(args.vocab)
    same_text = 0
    for beams, nbest in zip(pyctc_out, kernel_out, strict=True):
        ours = "".join(labels[t] for t in nbest[0].tokens).replace("▁", " ").strip()
        same_text += beams[0][0] == ours

    audio_frames = args.batch * args.frames
    print(f"machine: {cpu_model()}, {os.cpu_count()} cpus, torch {torch.__version__}, one thread")
    print(f"batch {args.batch} x {args.frames} frames, vocab {args.vocab}, beam {args.beam}; "
          f"argmax is blank on {blank_share:.0%} of frames")
    for name, seconds in (("oasr kernel (numba)", t_kernel), ("oasr reference (Python)", t_reference),
                          ("pyctcdecode 0.5 (no LM)", t_pyctc)):
        print(f"  {name:26s} {seconds:8.3f} s   {audio_frames / seconds:10.0f} frames/s")
    print(f"kernel vs pyctcdecode: {t_pyctc / t_kernel:.1f}x   kernel vs reference: {t_reference / t_kernel:.1f}x   "
          f"reference vs pyctcdecode: {t_pyctc / t_reference:.2f}x")
    print(f"best text equal to pyctcdecode's on {same_text}/{args.batch} rows")
    print(f"(for information: the kernel with blank_skip_threshold=0.95 takes {t_skip:.3f} s, "
          f"{t_pyctc / t_skip:.1f}x pyctcdecode)")


if __name__ == "__main__":
    main()
