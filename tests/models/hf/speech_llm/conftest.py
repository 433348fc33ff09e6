"""Fixtures of the Qwen2-Audio (``speech_llm``) tests: tiny random ``Qwen2AudioForConditionalGeneration``
checkpoints built by transformers (two shapes), a small byte-level BPE tokenizer with Qwen2-Audio's special
tokens (trained here by the ``tokenizers`` library), and espeak-ng speech."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.models.hf.whisper import _helpers as wh

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>",
            "<|en|>", "<|de|>"]
CORPUS = [
    "Detect the language and recognize the speech:", "Generate the caption in English:",
    "the quick brown fox jumps over the lazy dog", "she sells sea shells by the sea shore",
    "please call me back when you get this message", "the weather today is sunny with a light breeze",
    "transcribe this audio clip word for word", "what did the speaker say in this recording",
]
#: (audio tower, text model, seed): a GQA LM (4 heads over 2 K/V heads, rope theta 1e6) and an MHA one whose
#: text_config says tie_word_embeddings (which transformers' Qwen2-Audio ignores: its lm_head is its own)
SHAPES = {
    "gqa": (dict(d_model=64, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=128),
            dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}), 0),
    "mha": (dict(d_model=48, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=96),
             dict(hidden_size=48, intermediate_size=96, num_hidden_layers=3, num_attention_heads=2,
                  num_key_value_heads=2, tie_word_embeddings=True), 1),
}
SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Hello.",
    "Please call me back when you get this message, thank you.",
)


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tk.train_from_iterator(CORPUS, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>", pad_token="<|endoftext|>")


def build_checkpoint(root: Path, audio: dict, text: dict, seed: int) -> Path:
    from transformers import (
        GenerationConfig,
        Qwen2AudioConfig,
        Qwen2AudioForConditionalGeneration,
        Qwen2AudioProcessor,
        WhisperFeatureExtractor,
    )

    tokenizer = build_tokenizer()
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen2AudioConfig(
        audio_config=dict(audio, num_mel_bins=128, max_source_positions=1500, model_type="qwen2_audio_encoder"),
        text_config=dict(text, vocab_size=len(tokenizer), max_position_embeddings=4096, model_type="qwen2",
                         eos_token_id=eos, pad_token_id=eos),
        audio_token_index=tokenizer.convert_tokens_to_ids("<|AUDIO|>"))
    torch.manual_seed(seed)
    model = Qwen2AudioForConditionalGeneration(config).eval()
    with torch.no_grad():  # widened init so a random model's next token depends on its input
        for name, p in model.named_parameters():
            if p.dim() >= 2 and "embed_positions" not in name:
                p.normal_(0.0, 1.5 / p.shape[-1] ** 0.5)
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=eos)
    model.save_pretrained(root)
    extractor = WhisperFeatureExtractor(feature_size=128)
    Qwen2AudioProcessor(feature_extractor=extractor, tokenizer=tokenizer).save_pretrained(root)
    return root


@pytest.fixture(scope="session", params=sorted(SHAPES))
def llm_dir(request, tmp_path_factory) -> Path:
    audio, text, seed = SHAPES[request.param]
    return build_checkpoint(tmp_path_factory.mktemp(f"qwen2_audio_{request.param}"), audio, text, seed)


@pytest.fixture(scope="session")
def hf_llm(llm_dir):
    from transformers import AutoProcessor, Qwen2AudioForConditionalGeneration

    return Qwen2AudioForConditionalGeneration.from_pretrained(llm_dir).eval(), AutoProcessor.from_pretrained(llm_dir)


@pytest.fixture(scope="session")
def ours(llm_dir):
    from oasr.checkpoints.loading import load_pretrained

    return load_pretrained(llm_dir)


@pytest.fixture(scope="session")
def speech(tmp_path_factory) -> list:
    out = tmp_path_factory.mktemp("llm_espeak")
    return [wh.espeak(text, out / f"s{i}.wav") for i, text in enumerate(SENTENCES)]
