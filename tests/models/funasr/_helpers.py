"""Helpers of the FunASR tests: the reference's own forward pieces, test audio, comparisons."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import attrs
import numpy as np
import torch

from tests.helpers import REPO

SAMPLE = REPO / "samples" / "sample.wav"
SAMPLE_RATE = 16000
SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "She sells sea shells by the sea shore.",
    "A journey of a thousand miles begins with a single step.",
    "Please call me back when you get this message.",
)


def read_wav(path: Path) -> np.ndarray:
    import soundfile as sf

    audio, rate = sf.read(str(path), dtype="float32")
    assert rate == SAMPLE_RATE, f"{path} is {rate} Hz"
    return audio if audio.ndim == 1 else audio.mean(axis=1)


def espeak(text: str, out: Path) -> np.ndarray:
    espeak_bin, sox_bin = shutil.which("espeak-ng"), shutil.which("sox")
    if espeak_bin is None or sox_bin is None:
        raise AssertionError("espeak-ng and sox are required (apt-get install -y espeak-ng sox)")
    raw = subprocess.run([espeak_bin, "-v", "en-us", "-s", "150", "--stdout", text], check=True,
                         capture_output=True).stdout
    subprocess.run([sox_bin, "-R", "-t", "wav", "-", "-r", str(SAMPLE_RATE), "-c", "1", "-b", "16", str(out)],
                   input=raw, check=True, capture_output=True)
    return read_wav(out)


def reference(path: Path):
    from funasr import AutoModel

    return AutoModel(model=str(path), disable_update=True, device="cpu", disable_pbar=True, disable_log=True)


@attrs.define
class RefPass:
    """FunASR's own pieces over one batch: CMVN'd features, encoder output, predictor, log-probs."""

    feats: torch.Tensor
    feat_lens: torch.Tensor
    raw_feats: torch.Tensor
    hidden: torch.Tensor
    hidden_lens: torch.Tensor
    embeds: torch.Tensor
    token_num: torch.Tensor
    alphas: torch.Tensor
    fires: torch.Tensor
    log_probs: torch.Tensor
    token_lens: torch.Tensor


def reference_pass(ref, waves: list[np.ndarray]) -> RefPass:
    from funasr.utils.load_utils import extract_fbank

    frontend = ref.kwargs["frontend"]
    feats, lens = extract_fbank([torch.from_numpy(w) for w in waves], data_type="sound", frontend=frontend)
    model = ref.model
    with torch.no_grad():
        hidden, hidden_lens = model.encode(feats, lens)
        embeds, token_num, alphas, fires = model.calc_predictor(hidden, hidden_lens)[:4]
        token_lens = token_num.round().long()
        log_probs = model.cal_decoder_with_predictor(hidden, hidden_lens, embeds, token_lens)[0]
    cmvn = frontend.cmvn
    valid = (torch.arange(feats.shape[1])[None, :] < lens[:, None])[..., None]
    raw = (feats / cmvn[1] - cmvn[0]) * valid
    return RefPass(feats, lens.long(), raw, hidden, hidden_lens, embeds, token_num, alphas, fires, log_probs,
                   token_lens)


def generate(ref, waves: list[np.ndarray], **kwargs) -> list[dict]:
    return ref.generate(input=list(waves), batch_size=len(waves), **kwargs)


def rel_err(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    """max |a - b| / max |b| (the scale-relative error of a tensor)."""
    return float((ours.float() - theirs.float()).abs().max() / theirs.float().abs().max().clamp_min(1e-12))


def margins(log_probs: torch.Tensor) -> torch.Tensor:
    """(N, V) log-probs → the top-1 minus top-2 gap per position."""
    top = log_probs.topk(2, dim=-1).values
    return top[..., 0] - top[..., 1]
