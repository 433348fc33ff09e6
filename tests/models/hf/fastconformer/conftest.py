"""Fixtures of the FastConformer (Parakeet) tests: tiny random ``ParakeetForCTC`` / ``ParakeetForRNNT`` /
``ParakeetForTDT`` checkpoints built by transformers itself (init widened, BatchNorm statistics random), saved
with a ``ParakeetProcessor`` (a small Unigram tokenizer built by the ``tokenizers`` library), and espeak-ng
speech."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.models.hf.whisper import _helpers as wh

LETTERS = "abcdefghijklmnopqrstuvwxyz'"
WORDS = ["the", "and", "of", "to", "in", "is", "you", "that", "it", "he", "was", "for", "on", "are", "as", "with"]
SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Please call me back when you get this message.",
    "No.",
    "The weather today is sunny with a light breeze and the sea is calm.",
)
#: two encoder shapes: 80 mels with subsampling 8 (the release's), 128 mels with subsampling 4 and no input scale
SHAPES = {
    "s8": dict(num_mel_bins=80, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
               conv_kernel_size=9, subsampling_conv_channels=16, subsampling_factor=8, seed=0),
    "s4": dict(num_mel_bins=128, hidden_size=48, num_hidden_layers=3, num_attention_heads=4, intermediate_size=96,
               conv_kernel_size=5, subsampling_conv_channels=8, subsampling_factor=4, scale_input=False, seed=1),
}
NO_DROPOUT = dict(dropout=0.0, layerdrop=0.0, activation_dropout=0.0, attention_dropout=0.0, initializer_range=0.5)


def pieces() -> list[tuple[str, float]]:
    out = [("<unk>", 0.0), ("▁", -2.0)]
    out += [("▁" + w, -3.0 - i * 0.1) for i, w in enumerate(WORDS)]
    return out + [(c, -5.0) for c in LETTERS] + [("▁" + c, -6.0) for c in LETTERS]


def tokenizer(blank: str):
    """A ParakeetTokenizer over a SentencePiece-style Unigram vocabulary, ``blank`` added last (its blank id)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import ParakeetTokenizer

    backend = Tokenizer(models.Unigram(pieces(), unk_id=0))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    if blank == "<pad>":
        return ParakeetTokenizer(tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>")
    tok = ParakeetTokenizer(tokenizer_object=backend, unk_token="<unk>", pad_token="<unk>")
    tok.add_tokens([blank], special_tokens=True)
    return tok


def _randomize_batchnorm(model) -> None:
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm1d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 2.0)
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.2, 0.2)


def _calibrate_blank(model, mels: int, blank_share: float = 0.6) -> None:
    """Make a random joint label speech: center the encoder projection on random features' mean frame (the
    frames of a random encoder share a large common part, which would pick one label everywhere), then
    raise the blank bias so blank wins about ``blank_share`` of (frame, label) pairs — a random joint
    otherwise emits ``max_symbols_per_step`` labels on every frame."""
    import transformers as tf

    vocab, blank = model.config.vocab_size, model.config.blank_token_id
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        feats = torch.randn(1, 400, mels, generator=generator)
        mean = model.encoder(input_features=feats).last_hidden_state[0].mean(0)
        model.encoder_projector.bias.copy_(-(model.encoder_projector.weight @ mean))
        model.decoder.decoder_projector.weight.mul_(3.0)  # the label history weighs as much as the frame
        enc = model.get_audio_features(input_features=feats[:, :160]).pooler_output[0]
        pred = model.decoder(torch.arange(vocab)[:, None])[:, 0]
        logits = model.joint(encoder_hidden_states=enc[:, None], decoder_hidden_states=pred[None])[..., :vocab]
        gap = logits[..., :blank].max(-1).values - logits[..., blank]
        model.joint.head.bias[blank] += float(gap.flatten().quantile(blank_share))
        if isinstance(model, tf.ParakeetForTDT):
            # transformers' generate() appends the argmax over all V + len(durations) logits: keep every
            # duration logit below the best token logit so that argmax is the token NeMo's TDT emits
            # duration 0 (another label at the same frame) wins about 5 % of pairs: transformers' TDT
            # generate() has no per-frame label limit, so long runs at one frame would decode differently
            zero = vocab + list(model.config.durations).index(0)
            both = model.joint(encoder_hidden_states=enc[:, None], decoder_hidden_states=pred[None])
            others = torch.cat([both[..., vocab:zero], both[..., zero + 1:]], -1).max(-1).values
            model.joint.head.bias[zero] -= float((both[..., zero] - others).flatten().quantile(0.95))
            both = model.joint(encoder_hidden_states=enc[:, None], decoder_hidden_states=pred[None])
            lift = float(both[..., vocab:].max() - both[..., :vocab].max(-1).values.min())
            model.joint.head.bias[vocab:] -= max(lift, 0.0) + 20.0


def build_checkpoint(root: Path, shape: dict, kind: str) -> Path:
    """A random Parakeet model of ``kind`` ("ctc", "rnnt", "tdt") saved with its processor in ``root``."""
    import transformers as tf

    shape = dict(shape)
    seed = shape.pop("seed")
    encoder = dict(shape, **NO_DROPOUT)
    tok = tokenizer("<pad>" if kind == "ctc" else "<blank>")
    vocab = len(tok)
    torch.manual_seed(seed)
    if kind == "ctc":
        model = tf.ParakeetForCTC(tf.ParakeetCTCConfig(vocab_size=vocab, pad_token_id=vocab - 1,
                                                       encoder_config=encoder)).eval()
        with torch.no_grad():
            model.ctc_head.weight.mul_(4.0)
            model.ctc_head.bias.uniform_(-1.0, 1.0)
    else:
        config_cls, model_cls = ((tf.ParakeetRNNTConfig, tf.ParakeetForRNNT) if kind == "rnnt"
                                 else (tf.ParakeetTDTConfig, tf.ParakeetForTDT))
        # pad = blank: generate() pads finished rows with it, so a row's labels are its non-blank ids; at most
        # 3 labels a frame (a random joint that prefers a label at a frame keeps preferring it there)
        config = config_cls(vocab_size=vocab, blank_token_id=vocab - 1, pad_token_id=vocab - 1,
                            decoder_hidden_size=40, num_decoder_layers=2, max_symbols_per_step=3,
                            encoder_config=encoder)
        model = model_cls(config).eval()
        model.generation_config.decoder_start_token_id = vocab - 1
    _randomize_batchnorm(model)
    if kind != "ctc":
        _calibrate_blank(model, shape["num_mel_bins"])
    model.save_pretrained(root)
    tf.ParakeetProcessor(tf.ParakeetFeatureExtractor(feature_size=shape["num_mel_bins"]), tok).save_pretrained(root)
    return root


@pytest.fixture(scope="session", params=sorted(SHAPES))
def ctc_dir(request, tmp_path_factory) -> Path:
    return build_checkpoint(tmp_path_factory.mktemp(f"parakeet_ctc_{request.param}"), SHAPES[request.param], "ctc")


@pytest.fixture(scope="session")
def hf_ctc(ctc_dir):
    from transformers import AutoProcessor, ParakeetForCTC

    return ParakeetForCTC.from_pretrained(ctc_dir).eval(), AutoProcessor.from_pretrained(ctc_dir)


@pytest.fixture(scope="session")
def ours_ctc(ctc_dir):
    from oasr.checkpoints.loading import load_pretrained

    return load_pretrained(ctc_dir)


@pytest.fixture(scope="session", params=[f"{kind}_{shape}" for kind in ("rnnt", "tdt") for shape in sorted(SHAPES)])
def transducer_dir(request, tmp_path_factory) -> Path:
    kind, shape = request.param.split("_")
    return build_checkpoint(tmp_path_factory.mktemp(f"parakeet_{request.param}"), SHAPES[shape], kind)


def espeak(text: str, out: Path) -> np.ndarray:
    """espeak-ng speech at 16 kHz, the same samples on every run (sox's dither seeded: ``-R``)."""
    espeak_bin, sox_bin = shutil.which("espeak-ng"), shutil.which("sox")
    if espeak_bin is None or sox_bin is None:
        raise AssertionError("espeak-ng and sox are required (apt-get install -y espeak-ng sox)")
    raw = subprocess.run([espeak_bin, "-v", "en-us", "-s", "130", "--stdout", text], check=True,
                         capture_output=True).stdout
    subprocess.run([sox_bin, "-R", "-t", "wav", "-", "-r", "16000", "-c", "1", "-b", "16", str(out)], input=raw,
                   check=True, capture_output=True)
    return wh.read_wav(out)


@pytest.fixture(scope="session")
def speech(tmp_path_factory) -> list:
    out = tmp_path_factory.mktemp("parakeet_espeak")
    return [espeak(text, out / f"s{i}.wav") for i, text in enumerate(SENTENCES)]


#: the small encoder of the fast-path tests (16 mels, 2 layers of 32)
SMALL_ENCODER = dict(num_mel_bins=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                     conv_kernel_size=9, subsampling_conv_channels=8)


@pytest.fixture()
def encoder():
    """A small random ``FastConformerEncoder`` in eval mode (seed 0)."""
    from oasr_models_hf.fastconformer.config import FastConformerConfig
    from oasr_models_hf.fastconformer.encoder import FastConformerEncoder

    torch.manual_seed(0)
    return FastConformerEncoder(FastConformerConfig(vocab_size=9, blank_id=8, **SMALL_ENCODER)).eval()


def run_encoder(encoder, feats: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    """The encoder's hidden states under ``no_grad``."""
    with torch.no_grad():
        return encoder(feats, lens)[0]
