"""Runs ``nemo_tdt_beam_oracle.py`` (NeMo's ``BeamTDTInfer``) in NeMo's own venv and compares n-best lists.

NeMo is the oracle: a missing NeMo venv fails the test, it never skips it."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import torch

from tests.helpers import nemo_python

ORACLE = Path(__file__).with_name("nemo_tdt_beam_oracle.py")


def run_nemo_tdt_beam(specs: dict[str, dict], workdir: Path) -> dict:
    """NeMo's n-best lists per named spec (see ``nemo_tdt_beam_oracle.py``), one NeMo process for all."""
    workdir.mkdir(parents=True, exist_ok=True)
    torch.save(specs, workdir / "in.pt")
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run([str(nemo_python()), str(ORACLE), str(workdir / "in.pt"), str(workdir / "out.pt")],
                          capture_output=True, text=True, timeout=900, env=env, cwd=workdir)
    if proc.returncode != 0:
        raise AssertionError(f"NeMo's TDT beam oracle failed:\n{proc.stderr[-4000:]}")
    return torch.load(workdir / "out.pt", weights_only=True)


def lstm_joint_spec(embedding, lstm_layers, enc, pred, head, *, activation: str, durations, encoder) -> dict:
    """A ``nemo_tdt_beam_oracle.py`` input from plain tensors: the embedding (V, H) with the blank last,
    ``lstm_layers`` a list of (weight_ih, weight_hh, bias_ih, bias_hh) per layer, the joint's encoder and
    predictor projections and head as (weight, bias) pairs."""
    decoder = {"prediction.embed.weight": embedding}
    for i, (w_ih, w_hh, b_ih, b_hh) in enumerate(lstm_layers):
        for name, value in (("weight_ih", w_ih), ("weight_hh", w_hh), ("bias_ih", b_ih), ("bias_hh", b_hh)):
            decoder[f"prediction.dec_rnn.lstm.{name}_l{i}"] = value
    joint = {"enc.weight": enc[0], "enc.bias": enc[1], "pred.weight": pred[0], "pred.bias": pred[1],
             "joint_net.1.weight": head[0], "joint_net.1.bias": head[1]}
    clean = {k: v.detach().float().contiguous().clone() for k, v in decoder.items()}
    return {"vocab": int(embedding.shape[0]), "pred_hidden": int(embedding.shape[1]), "pred_layers": len(lstm_layers),
            "enc_hidden": int(enc[0].shape[1]), "joint_hidden": int(enc[0].shape[0]), "activation": activation,
            "durations": [int(d) for d in durations], "decoder": clean,
            "joint": {k: v.detach().float().contiguous().clone() for k, v in joint.items()},
            "encoder": [e.detach().float().contiguous().clone() for e in encoder]}


def nbest_mismatch(ours: list, theirs: list[dict], *, abs_tol: float = 1e-4, rel_tol: float = 1e-5) -> str | None:
    """Why our n-best (Hypothesis list) differs from NeMo's (None: the same labels in the same order, scores
    within float32 noise)."""
    ours_tokens = [list(h.tokens) for h in ours]
    their_tokens = [h["tokens"] for h in theirs]
    if ours_tokens != their_tokens:
        return f"labels differ: ours {ours_tokens} vs NeMo {their_tokens}"
    for h, ref in zip(ours, theirs, strict=True):
        if abs(h.score - ref["score"]) > abs_tol + rel_tol * abs(ref["score"]):
            return f"score of {ref['tokens']} differs: ours {h.score} vs NeMo {ref['score']}"
    return None


@contextlib.contextmanager
def perturbed_head(joiner, seed: int, scale: float = 1e-6, layer: int = -1):
    """The joiner with one layer (``layer`` among its modules with a 2-D weight, in order: -1 the output layer,
    0 the encoder projection) moved by ``scale`` x its mean magnitude x N(0, 1) noise, restored on exit.  A
    result that changes under it sits on a near-tie: choose ``scale`` well above the float noise of the two
    implementations at that layer (bit-level for the same frames; the encoder tolerance for the frames of
    two encoders)."""
    module = [m for m in joiner.modules() if isinstance(getattr(m, "weight", None), torch.Tensor)
              and m.weight.dim() == 2][layer]
    saved = {k: v.clone() for k, v in module.state_dict().items()}
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32).to(p.dtype)
            p.add_(noise * scale * p.abs().mean())
    try:
        yield joiner
    finally:
        module.load_state_dict(saved)
