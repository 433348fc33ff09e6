"""Fixtures of the MedASR (``lasr_ctc``) tests: tiny random ``LasrForCTC`` checkpoints built by transformers
itself (two shapes), saved with their tokenizer and feature extractor, and espeak-ng speech."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.models.hf.whisper import _helpers as wh

#: two shapes: the release's even depthwise kernel (32) and 128 mels, and a narrower one with 80 mels
SHAPES = {
    "k32": dict(num_mel_bins=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                conv_kernel_size=32, subsampling_conv_channels=32, seed=0),
    "k10": dict(num_mel_bins=80, hidden_size=48, num_hidden_layers=3, num_attention_heads=2, intermediate_size=96,
                conv_kernel_size=10, subsampling_conv_channels=24, seed=1),
}
SPECIALS = ["<epsilon>", "<s>", "</s>", "<unk>"]
LETTERS = "abcdefghijklmnopqrstuvwxyz'"
WORDS = ["the", "and", "of", "to", "in", "is", "you", "that", "it", "he", "was", "for", "on", "are", "as", "with"]
SENTENCES = (
    "The patient reports chest pain.",
    "Blood pressure is one hundred twenty over eighty and the heart rate is regular.",
    "No fever.",
    "Continue the current medication for two weeks and follow up in the clinic.",
)


def vocabulary() -> list[tuple[str, float]]:
    pieces = [(s, 0.0) for s in SPECIALS] + [("▁", -2.0)]
    pieces += [("▁" + w, -3.0 - i * 0.1) for i, w in enumerate(WORDS)]
    pieces += [(c, -5.0) for c in LETTERS] + [("▁" + c, -6.0) for c in LETTERS]
    return pieces


def build_checkpoint(root: Path, shape: dict) -> Path:
    """A random LasrForCTC (init widened, BatchNorm statistics random) saved with its processor."""
    from transformers import LasrCTCConfig, LasrFeatureExtractor, LasrForCTC, LasrTokenizer

    shape = dict(shape)
    seed = shape.pop("seed")
    tokenizer = LasrTokenizer(vocab=vocabulary(), pad_token="<epsilon>", bos_token="<s>", eos_token="</s>",
                              unk_token="<unk>", extra_ids=0)
    vocab_size = len(vocabulary())
    config = LasrCTCConfig(vocab_size=vocab_size, pad_token_id=0,
                           encoder_config=dict(shape, initializer_range=0.5, dropout=0.0, layerdrop=0.0,
                                               activation_dropout=0.0, attention_dropout=0.0))
    torch.manual_seed(seed)
    model = LasrForCTC(config).eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm1d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 2.0)
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.2, 0.2)
        model.ctc_head.weight.mul_(4.0)
        model.ctc_head.bias.uniform_(-1.0, 1.0)
    model.save_pretrained(root)
    tokenizer.save_pretrained(root)
    LasrFeatureExtractor(feature_size=shape["num_mel_bins"]).save_pretrained(root)
    return root


@pytest.fixture(scope="session", params=sorted(SHAPES))
def lasr_dir(request, tmp_path_factory) -> Path:
    return build_checkpoint(tmp_path_factory.mktemp(f"lasr_{request.param}"), SHAPES[request.param])


@pytest.fixture(scope="session")
def hf_lasr(lasr_dir):
    from transformers import AutoProcessor, LasrForCTC

    return LasrForCTC.from_pretrained(lasr_dir).eval(), AutoProcessor.from_pretrained(lasr_dir)


@pytest.fixture(scope="session")
def ours(lasr_dir):
    from oasr.checkpoints.loading import load_pretrained

    return load_pretrained(lasr_dir)


@pytest.fixture(scope="session")
def speech(tmp_path_factory) -> list:
    out = tmp_path_factory.mktemp("lasr_espeak")
    return [wh.espeak(text, out / f"s{i}.wav") for i, text in enumerate(SENTENCES)]
