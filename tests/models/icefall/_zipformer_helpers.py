"""Helpers of the Zipformer tests: fixture audio, the encoder of any fixture, relative errors."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import soundfile as sf
import torch

from oasr_models_icefall import release
from oasr_models_icefall.zipformer.convert import infer_zipformer_config
from oasr_models_icefall.zipformer.encoder import ZipformerEncoderModel
from oasr_models_icefall.zipformer.model import ENCODER_RENAMES

#: the left context (embed frames) the causal fixtures were decoded with (their training flag)
FIXTURE_LEFT_CONTEXT = 64


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """max |got - ref| / max |ref| (the acceptance metric)."""
    assert got.shape == ref.shape, (tuple(got.shape), tuple(ref.shape))
    return ((got.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


def wave(path: Path) -> torch.Tensor:
    """A fixture clip as float32 samples in [-1, 1] (int16 / 32768)."""
    samples, rate = sf.read(str(path), dtype="int16")
    assert rate == 16000
    return torch.from_numpy(samples).float() / 32768


def encoder_of(directory: Path) -> ZipformerEncoderModel:
    """The Zipformer encoder of any fixture (CTC or transducer), weights loaded strictly."""
    state = release.load_state_dict(directory)
    encoder = ZipformerEncoderModel(infer_zipformer_config(state)).eval()
    (pattern, repl), = ENCODER_RENAMES
    # the model's own prefix renames, then the encoder module's keys below "encoder."
    own = {re.sub(pattern, repl, k)[len("encoder."):]: v for k, v in state.items()
           if k.startswith(("encoder.", "encoder_embed."))}
    encoder.load_state_dict(own, strict=True)
    return encoder


def training_flags(model_args: dict) -> dict[str, str]:
    """``ref/model_args.json`` flags as {"encoder_dim": "32,48,...", ...}."""
    flags = model_args["flags"]
    flags = shlex.split(flags) if isinstance(flags, str) else list(flags)
    return {flags[i].lstrip("-").replace("-", "_"): flags[i + 1] for i in range(0, len(flags), 2)}
