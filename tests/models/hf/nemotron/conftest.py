"""Fixtures of the Nemotron ASR tests: tiny random ``NemotronAsrStreamingForRNNT`` / ``Nemotron3_5AsrForRNNT``
checkpoints built by transformers itself (init widened, the joint's blank calibrated), saved with their own
processor (the Parakeet tests' small Unigram tokenizer, a 7-entry prompt table for 3.5), and espeak-ng speech."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.models.hf.fastconformer.conftest import NO_DROPOUT, SENTENCES, tokenizer
from tests.models.hf.whisper import _helpers as wh

#: the release's geometry scaled down: 80 mels, subsampling 8, lookahead 1 (trained chunk 2), window 7 (3 chunks
#: of history) so an espeak sentence spans many chunks
SHAPE = dict(num_mel_bins=80, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
             conv_kernel_size=9, subsampling_conv_channels=16, subsampling_factor=8, sliding_window=7,
             default_num_lookahead_tokens=1)
#: a prompt table in the release's spellings: a listed code, an xx-XX spelling, a shared locale slot, auto
PROMPTS = {"en-US": 0, "en": 0, "zh-CN": 4, "zh-ZH": 4, "zh-TW": 5, "vi-VN": 2, "auto": 6}
NUM_PROMPTS = 8
CALIBRATION = "Seven silver swans swam silently seaward at dawn."


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


def _calibrate_blank(model, extractor, prompts: list[int] | None, blank_share: float = 0.6) -> None:
    """Raise the joint's blank bias so blank wins about ``blank_share`` of (frame, label) pairs on log-mel
    features of a sentence no test decodes (a random joint otherwise emits ``max_symbols_per_step`` labels on
    every frame, or none)."""
    vocab, blank = model.config.vocab_size, model.config.blank_token_id
    with tempfile.TemporaryDirectory() as tmp:
        audio = espeak(CALIBRATION, Path(tmp) / "calibration.wav")
    feats = extractor(audio, sampling_rate=16000, return_tensors="pt").input_features
    with torch.no_grad():
        model.joint.head.bias.zero_()
        encs = []
        for prompt in prompts or [None]:
            kwargs = {} if prompt is None else {"prompt_ids": torch.tensor([prompt])}
            encs.append(model.get_audio_features(input_features=feats, num_lookahead_tokens=1,
                                                 **kwargs).pooler_output[0])
        enc = torch.cat(encs)
        # centre the projected frames: a random network's constant offset otherwise picks the same label everywhere
        model.encoder_projector.bias -= enc.mean(0)
        enc = enc - enc.mean(0)
        pred = model.decoder(torch.arange(vocab)[:, None])[:, 0]
        logits = model.joint(encoder_hidden_states=enc[:, None], decoder_hidden_states=pred[None])
        gap = logits[..., :blank].max(-1).values - logits[..., blank]
        model.joint.head.bias[blank] += float(gap.flatten().quantile(blank_share))


def build_checkpoint(root: Path, kind: str, seed: int = 0) -> Path:
    """A random ``nemotron_asr_streaming`` ("stream") or ``nemotron3_5_asr`` ("v35") model saved in ``root``."""
    import transformers as tf

    tok = tokenizer("<blank>")
    vocab = len(tok)
    encoder = dict(SHAPE, **NO_DROPOUT)
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, blank_token_id=vocab - 1, pad_token_id=vocab - 1, decoder_hidden_size=40,
                  num_decoder_layers=2, max_symbols_per_step=3)
    fe = tf.NemotronAsrStreamingFeatureExtractor(feature_size=SHAPE["num_mel_bins"])
    if kind == "stream":
        encoder_config = tf.NemotronAsrStreamingEncoderConfig(**encoder)
        model = tf.NemotronAsrStreamingForRNNT(tf.NemotronAsrStreamingConfig(encoder_config=encoder_config,
                                                                             **common)).eval()
        processor = tf.NemotronAsrStreamingProcessor(fe, tok, supported_num_lookahead_tokens=[1, 0])
    else:
        encoder_config = tf.NemotronAsrStreamingEncoderConfig(**encoder)
        model = tf.Nemotron3_5AsrForRNNT(tf.Nemotron3_5AsrConfig(
            encoder_config=encoder_config, num_prompts=NUM_PROMPTS, prompt_intermediate_size=128,
            default_prompt_id=PROMPTS["auto"], initializer_range=NO_DROPOUT["initializer_range"], **common)).eval()
        processor = tf.Nemotron3_5AsrProcessor(fe, tok, supported_num_lookahead_tokens=[1, 0],
                                               prompt_dictionary=PROMPTS, num_prompts=NUM_PROMPTS)
    model.generation_config.decoder_start_token_id = vocab - 1
    _calibrate_blank(model, fe, sorted(set(PROMPTS.values())) if kind == "v35" else None)
    model.save_pretrained(root)
    processor.save_pretrained(root)
    return root


@pytest.fixture(scope="session")
def stream_dir(tmp_path_factory) -> Path:
    return build_checkpoint(tmp_path_factory.mktemp("nemotron_stream"), "stream")


@pytest.fixture(scope="session")
def v35_dir(tmp_path_factory) -> Path:
    return build_checkpoint(tmp_path_factory.mktemp("nemotron_v35"), "v35", seed=1)


@pytest.fixture(scope="session", params=["stream", "v35"])
def any_dir(request, stream_dir, v35_dir) -> Path:
    return stream_dir if request.param == "stream" else v35_dir


def load_hf(path: Path):
    """transformers' model (the class of the directory's model_type) and processor."""
    import transformers as tf

    config = tf.AutoConfig.from_pretrained(path)
    cls = tf.Nemotron3_5AsrForRNNT if config.model_type == "nemotron3_5_asr" else tf.NemotronAsrStreamingForRNNT
    return cls.from_pretrained(path).eval(), tf.AutoProcessor.from_pretrained(path)


@pytest.fixture(scope="session")
def speech(tmp_path_factory) -> list:
    out = tmp_path_factory.mktemp("nemotron_espeak")
    return [espeak(text, out / f"s{i}.wav") for i, text in enumerate(SENTENCES)]


def states_for(encoder, prompt=None):
    """Fresh streaming states of ``encoder`` (the declared fill values), its prompt slot set to ``prompt``."""
    states = {s.name: torch.full(s.shape, s.fill_value, dtype=getattr(torch, s.dtype))
              for s in encoder.streaming_state_specs}
    if prompt is not None:
        states["prompt"][:] = prompt
    return states


def stream_by_hand(encoder, feats: torch.Tensor, chunk: int, prompt=None) -> list[torch.Tensor]:
    """One stream's features (T, F) chunk by chunk through forward_chunk_slots, as the executor feeds them
    (``streaming_tail_frames`` zero frames appended); each chunk's valid hidden frames."""
    encoder.prepare_streaming(chunk, -1)  # sizes the K/V ring for this chunk, as the engine does
    geometry = encoder.streaming_geometry(chunk)
    width = geometry.window_frames
    stream = torch.cat([feats, torch.zeros(encoder.streaming_tail_frames, feats.shape[1])])
    states, outs, offset = states_for(encoder, prompt), [], 0
    with torch.no_grad():
        for pos in range(0, stream.shape[0], geometry.stride_frames):
            piece = stream[pos:pos + width]
            window = torch.zeros(1, width, feats.shape[1])
            window[0, :piece.shape[0]] = piece
            hidden, valid, updated = encoder.forward_chunk_slots(window, torch.tensor([piece.shape[0]]),
                                                                 torch.tensor([offset]), states)
            states.update(updated)
            outs.append(hidden[0, :int(valid[0])])
            offset += int(valid[0])
    return outs
