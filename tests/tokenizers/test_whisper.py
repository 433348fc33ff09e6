"""The whisper kind against openai-whisper's own tokenizer (tiktoken), multilingual and English-only."""

from __future__ import annotations

import random

import pytest
import whisper.tokenizer as wt

from oasr.models import TokenizerSpec
from oasr.tokenizers import TokenizerError, build_tokenizer
from oasr.tokenizers.whisper import WhisperTokenizer

from .conftest import TEXT

SENTENCES = TEXT + [
    " Ever tried. Ever failed. No matter. Try again. Fail again. Fail better.",
    "  leading spaces and\ttabs\nnewlines  ",
    "Привет мир! Γειά σου κόσμε. مرحبا بالعالم. नमस्ते दुनिया 안녕하세요 세계",
    "♪♪ (music) [DAVID] Hey there -- it's fine",
]


@pytest.fixture(scope="module")
def multilingual(whisper_multilingual_json):
    ours = build_tokenizer(TokenizerSpec("whisper", {"tokenizer": whisper_multilingual_json.name}),
                           whisper_multilingual_json.parent)
    return ours, wt.get_tokenizer(True, num_languages=99)


@pytest.fixture(scope="module")
def english(whisper_en_json):
    return WhisperTokenizer.from_spec(TokenizerSpec("whisper", {"tokenizer": str(whisper_en_json)}), None), \
        wt.get_tokenizer(False)


@pytest.mark.reference
@pytest.mark.parametrize("which", ["multilingual", "english"])
def test_encode_and_decode_equal_openai_whisper(which, request):
    ours, ref = request.getfixturevalue(which)
    for text in SENTENCES:
        ids = ours.encode(text)
        assert ids == ref.encode(text), text
        assert ours.decode(ids) == ref.decode(ids) == text
    # arbitrary text-token sequences, including ones that cut characters in half: openai-whisper's
    # decode marks broken bytes with U+FFFD, ours drops them and is otherwise identical
    rng = random.Random(0)
    for _ in range(300):
        ids = [rng.randrange(ref.eot) for _ in range(rng.randint(0, 12))]
        assert ours.decode(ids) == ref.decode(ids).replace("\ufffd", "")


@pytest.mark.reference
@pytest.mark.parametrize("which", ["multilingual", "english"])
def test_special_token_ids_equal_openai_whisper(which, request):
    ours, ref = request.getfixturevalue(which)
    for name in ("eot", "sot", "translate", "transcribe", "sot_lm", "sot_prev", "no_speech", "no_timestamps",
                 "timestamp_begin"):
        assert getattr(ours, name) == getattr(ref, name), name
    # openai-whisper lists languages in set order; ours are in token order
    assert list(ours.language_ids) == sorted(ref.all_language_tokens)
    assert dict(zip(ours.languages, ours.language_ids, strict=True)) == dict(zip(ref.all_language_codes, ref.all_language_tokens, strict=True))
    for code in ("en", "zh", "de", "ja", "haw", "su"):
        assert ours.language_token(code) == ref.to_language_token(code)
    assert ours.non_speech_tokens() == list(ref.non_speech_tokens)
    assert ours.special_ids == frozenset(range(ours.eot, ours.vocab_size))


@pytest.mark.reference
def test_vocabulary_sizes_and_multilinguality(multilingual, english):
    assert (multilingual[0].vocab_size, multilingual[0].multilingual) == (51865, True)
    assert (english[0].vocab_size, english[0].multilingual) == (51864, False)


@pytest.mark.reference
def test_sot_sequence_equals_openai_whisper(multilingual, english):
    ours, _ = multilingual
    for language in ("en", "fr", "zh"):
        for task in ("transcribe", "translate"):
            ref = wt.get_tokenizer(True, num_languages=99, language=language, task=task)
            assert ours.sot_sequence(language, task) == list(ref.sot_sequence)
    # no language: the prompt stops before the language token, which the model is asked to predict
    assert ours.sot_sequence() == [ours.sot]
    en, en_ref = english
    assert en.sot_sequence() == en.sot_sequence("en", "transcribe") == list(en_ref.sot_sequence)
    with pytest.raises(TokenizerError, match="English-only"):
        en.sot_sequence("fr")
    with pytest.raises(TokenizerError, match="xx"):
        ours.language_token("xx")


@pytest.mark.reference
@pytest.mark.parametrize("which", ["multilingual", "english"])
def test_timestamps(which, request):
    ours, ref = request.getfixturevalue(which)
    words = ours.encode(" Hello there. How are you?")
    ids = [ours.timestamp_begin, *words[:3], ours.timestamp_begin + 55, ours.timestamp_begin + 60, *words[3:],
           ours.timestamp_begin + 1500]
    assert ours.decode_with_timestamps(ids) == ref.decode_with_timestamps(ids)
    assert ours.decode(ids) == ref.decode(ids)
    assert ours.timestamp_token(1.1) == ours.timestamp_begin + 55
    assert ours.timestamp_seconds(ours.timestamp_begin + 1500) == pytest.approx(30.0)
    assert ours.id_to_piece(ours.timestamp_begin + 60) == "<|1.20|>"
