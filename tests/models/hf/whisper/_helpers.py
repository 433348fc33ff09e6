"""Helpers of the Whisper tests: reference models built offline, test audio, and small utilities."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[4]
SAMPLE_RATE = 16000
BECKETT_TEXT = "Ever tried. Ever failed. No matter. Try again. Fail again. Fail better."
#: sentences espeak-ng speaks for the trained-model tests (plain words, so WER is meaningful)
ESPEAK_SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "She sells sea shells by the sea shore.",
    "A journey of a thousand miles begins with a single step.",
    "Please call me back when you get this message.",
    "The weather today is sunny with a light breeze.",
)

#: the tiny random model: four heads of 16 over d_model 64, openai-whisper's fixed 4x MLP width
TINY = dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
            encoder_ffn_dim=256, decoder_ffn_dim=256)
TINY_ALIGNMENT_HEADS = [[1, 0], [1, 2]]


def whisper_tokenizer(multilingual: bool = True):
    """A Whisper ``tokenizers.Tokenizer`` built offline from openai-whisper's bundled tiktoken vocabulary."""
    import whisper.tokenizer as wt
    from transformers.convert_slow_tokenizer import TikTokenConverter

    encoding = wt.get_encoding("multilingual" if multilingual else "gpt2")
    vocab_file = Path(wt.__file__).parent / "assets" / f"{'multilingual' if multilingual else 'gpt2'}.tiktoken"
    specials = sorted(encoding._special_tokens, key=encoding._special_tokens.get)
    return TikTokenConverter(vocab_file=str(vocab_file), pattern=encoding._pat_str,
                             extra_special_tokens=specials).converted()


def build_tiny_hf(out: Path, tokenizer_dir: Path, *, seed: int = 0) -> Path:
    """A random HF Whisper (init_std 0.5 so greedy tokens vary) with a real multilingual vocabulary
    and the generation config a real checkpoint carries."""
    import whisper.tokenizer as wt
    from transformers import GenerationConfig, WhisperConfig, WhisperForConditionalGeneration

    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, out / name)
    oa = wt.get_tokenizer(True, num_languages=99)
    suppress = sorted(oa.non_speech_tokens)
    lang_to_id = {f"<|{code}|>": oa.to_language_token(code) for code in list(wt.LANGUAGES)[:99]}
    torch.manual_seed(seed)
    config = WhisperConfig(vocab_size=51865, num_mel_bins=80, init_std=0.5, decoder_start_token_id=oa.sot,
                           bos_token_id=oa.eot, eos_token_id=oa.eot, pad_token_id=oa.eot, suppress_tokens=suppress,
                           begin_suppress_tokens=[220, oa.eot], **TINY)
    model = WhisperForConditionalGeneration(config).eval()
    model.generation_config = GenerationConfig(
        decoder_start_token_id=oa.sot, bos_token_id=oa.eot, eos_token_id=oa.eot, pad_token_id=oa.eot,
        max_length=448, no_timestamps_token_id=oa.no_timestamps, prev_sot_token_id=oa.sot_prev,
        is_multilingual=True, lang_to_id=lang_to_id, task_to_id={"transcribe": oa.transcribe, "translate": oa.translate},
        suppress_tokens=suppress, begin_suppress_tokens=[220, oa.eot], alignment_heads=TINY_ALIGNMENT_HEADS,
        max_initial_timestamp_index=50, return_timestamps=False)
    model.save_pretrained(out)
    return out


def to_openai_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An HF-layout Whisper state dict (with or without ``model.``) in openai-whisper's key names."""
    renames = (("self_attn_layer_norm", "attn_ln"), ("encoder_attn_layer_norm", "cross_attn_ln"),
               ("final_layer_norm", "mlp_ln"), ("self_attn.", "attn."), ("encoder_attn.", "cross_attn."),
               ("q_proj", "query"), ("k_proj", "key"), ("v_proj", "value"), ("out_proj", "out"),
               ("fc1", "mlp.0"), ("fc2", "mlp.2"))
    out = {}
    for key, value in state.items():
        key = key.removeprefix("model.")
        if key.endswith("proj_out.weight"):
            continue
        key = (key.replace("encoder.embed_positions.weight", "encoder.positional_embedding")
               .replace("decoder.embed_positions.weight", "decoder.positional_embedding")
               .replace("decoder.embed_tokens", "decoder.token_embedding")
               .replace("encoder.layer_norm", "encoder.ln_post").replace("decoder.layer_norm", "decoder.ln"))
        key = re.sub(r"layers\.(\d+)\.", r"blocks.\1.", key)
        for a, b in renames:
            key = key.replace(a, b)
        out[key] = value
    return out


def openai_model(config, state: dict[str, torch.Tensor], alignment_heads=None):
    """openai-whisper's ``Whisper`` holding the same weights as an OASR/HF model of ``config``."""
    from whisper.model import ModelDimensions, Whisper

    dims = ModelDimensions(
        n_mels=config.num_mel_bins, n_audio_ctx=config.max_source_positions, n_audio_state=config.d_model,
        n_audio_head=config.encoder_attention_heads, n_audio_layer=config.encoder_layers, n_vocab=config.vocab_size,
        n_text_ctx=config.max_target_positions, n_text_state=config.d_model,
        n_text_head=config.decoder_attention_heads, n_text_layer=config.decoder_layers)
    model = Whisper(dims)
    model.load_state_dict(to_openai_state_dict(state), strict=True)
    if alignment_heads is not None:
        heads = torch.zeros(config.decoder_layers, config.decoder_attention_heads, dtype=torch.bool)
        for layer, head in alignment_heads:
            heads[layer, head] = True
        model.register_buffer("alignment_heads", heads.to_sparse(), persistent=False)
    return model.eval()


def chirp_audio(seconds: float, f0: float, seed: int) -> np.ndarray:
    """Non-stationary test audio (a gated chirp with a little noise): random models decode it to varied tokens."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(SAMPLE_RATE * seconds)) / SAMPLE_RATE
    gate = np.sin(2 * np.pi * 1.5 * t) > 0
    return (0.3 * np.sin(2 * np.pi * (f0 + 300 * t) * t) * gate + 0.01 * rng.standard_normal(len(t))).astype(np.float32)


def window_features(audio: np.ndarray) -> torch.Tensor:
    """openai-whisper's features of one window: log-mel of audio + 30 s of silence, sliced and zero-padded."""
    import whisper.audio as wa

    mel = wa.log_mel_spectrogram(torch.from_numpy(audio), 80, padding=wa.N_SAMPLES)
    content = mel.shape[-1] - wa.N_FRAMES
    return torch.nn.functional.pad(mel[:, :content], (0, wa.N_FRAMES - content))


def read_wav(path: Path) -> np.ndarray:
    import soundfile as sf

    audio, rate = sf.read(str(path), dtype="float32")
    assert rate == SAMPLE_RATE, f"{path} is {rate} Hz"
    return audio if audio.ndim == 1 else audio.mean(axis=1)


def espeak(text: str, out: Path) -> np.ndarray:
    espeak_bin, sox_bin = shutil.which("espeak-ng"), shutil.which("sox")
    if espeak_bin is None or sox_bin is None:
        raise AssertionError("espeak-ng and sox are required (apt-get install -y espeak-ng sox)")
    raw = subprocess.run([espeak_bin, "-v", "en-us", "-s", "130", "--stdout", text], check=True,
                         capture_output=True).stdout
    subprocess.run([sox_bin, "-D", "-t", "wav", "-", "-r", str(SAMPLE_RATE), "-c", "1", "-b", "16", str(out)],
                   input=raw, check=True, capture_output=True)
    return read_wav(out)


def assets_dir() -> Path:
    return Path(os.environ.get("OASR_TEST_ASSETS", REPO / ".cache" / "assets"))


def normalize_words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split()


def wer(reference: str, hypothesis: str) -> float:
    """Word error rate on lower-cased words without punctuation (edit distance over words)."""
    ref, hyp = normalize_words(reference), normalize_words(hypothesis)
    prev = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        cur = [i] + [0] * len(hyp)
        for j, h in enumerate(hyp, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h))
        prev = cur
    return prev[-1] / max(1, len(ref))
