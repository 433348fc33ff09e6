"""Incremental decoding equals full decoding for every prefix, and never emits U+FFFD (all kinds)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oasr.models import TokenizerSpec
from oasr.tokenizers import build_tokenizer
from oasr.tokenizers.sentencepiece import SentencePieceTokenizer

from .conftest import TEXT
from .test_reference_parity import FUNASR_VOCAB, _trained_tokenizers

SAMPLES = TEXT + ["😀😃 漢字かな ✓ — x", "a  b   c", "Ünïcödé ǆ", "hel@@ lo 中国 a b c"]
KINDS = ["whisper", "sentencepiece_bytes", "sentencepiece_icefall", "hf_byte_level", "hf_metaspace",
         "hf_wordpiece", "symbol_table", "funasr_char"]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory, fixtures_dir, whisper_multilingual_json, sp_byte_model):
    root = tmp_path_factory.mktemp("incremental")
    out = {
        "whisper": build_tokenizer(TokenizerSpec("whisper", {"tokenizer": str(whisper_multilingual_json)}), None),
        "sentencepiece_bytes": SentencePieceTokenizer(sp_byte_model),
        "sentencepiece_icefall": build_tokenizer(
            TokenizerSpec("sentencepiece", {"model": "bpe.model"}), fixtures_dir / "zipformer_ctc" / "data" / "lang_bpe_500"),
        "symbol_table": build_tokenizer(
            TokenizerSpec("symbol_table", {"units": "units.txt"}), fixtures_dir / "wenet_u2pp" / "model"),
    }
    for name, tok in _trained_tokenizers().items():
        tok.save(str(root / f"{name}.json"))
        out[f"hf_{name}"] = build_tokenizer(TokenizerSpec("huggingface", {"tokenizer": f"{name}.json"}), root)
    (root / "tokens.json").write_text(json.dumps(FUNASR_VOCAB, ensure_ascii=False), encoding="utf-8")
    out["funasr_char"] = build_tokenizer(TokenizerSpec("funasr_char", {"tokens": "tokens.json"}), root)
    return out


@st.composite
def id_sequences(draw, tok):
    """Encoded text (multi-byte characters split over tokens), random ids, or a mix, with specials."""
    ids = []
    if draw(st.booleans()):
        text = draw(st.sampled_from(SAMPLES))
        try:
            encoded = tok.encode(text)
        except Exception:
            encoded = []
        start = draw(st.integers(0, max(0, len(encoded) - 1)))
        ids = encoded[start:start + 24]
    limit = min(tok.vocab_size, 51865)
    ids = list(ids) + draw(st.lists(st.integers(0, limit - 1), max_size=8))
    if draw(st.booleans()):
        ids = draw(st.permutations(ids))
    return ids


def _decode_in_chunks(tok, ids, cuts):
    decoder = tok.incremental_decoder()
    outputs, start = [], 0
    for cut in [*cuts, len(ids)]:
        outputs.append(decoder.push(ids[start:cut]))
        start = cut
    outputs.append(decoder.flush())
    return outputs


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_incremental_equals_full_decode_for_every_prefix(tokenizers, kind, data):
    tok = tokenizers[kind]
    ids = data.draw(id_sequences(tok))
    full = tok.decode(ids)
    assert "\ufffd" not in full
    for k in range(len(ids) + 1):
        prefix = ids[:k]
        cuts = sorted(data.draw(st.lists(st.integers(0, k), max_size=3)))
        outputs = _decode_in_chunks(tok, prefix, cuts)
        assert "".join(outputs) == tok.decode(prefix)
        assert not any("\ufffd" in out for out in outputs)
    # one token at a time: every partial is final text, so it is a prefix of the whole decode
    decoder = tok.incremental_decoder()
    partial = ""
    for token_id in ids:
        partial += decoder.push([token_id])
        assert full.startswith(partial)
    pieces = tok.token_pieces(ids)
    assert len(pieces) == len(ids) and "".join(pieces) == full


def test_a_split_character_waits_for_its_last_byte(tokenizers):
    tok = tokenizers["whisper"]
    ids = tok.encode(" 😀!")
    complete = next(k for k in range(len(ids) + 1) if "😀" in tok.decode(ids[:k]))
    assert complete >= 2  # the emoji's four bytes take several byte-level tokens
    decoder = tok.incremental_decoder()
    outputs = [decoder.push([i]) for i in ids]
    assert "😀" not in "".join(outputs[:complete - 1]) and "😀" in outputs[complete - 1]
    assert "".join(outputs) + decoder.flush() == " 😀!"
    # a character left unfinished at the end is dropped, not shown as U+FFFD
    assert decoder.push(ids[:complete - 1]) + decoder.flush() == tok.decode(ids[:complete - 1]) == " "
