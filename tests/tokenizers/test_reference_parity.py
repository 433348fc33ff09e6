"""sentencepiece, huggingface, symbol_table and funasr_char kinds against their reference libraries."""

from __future__ import annotations

import json
import random

import pytest
import sentencepiece as spm
from hypothesis import given, settings
from hypothesis import strategies as st

from oasr.models import TokenizerSpec
from oasr.tokenizers import build_tokenizer
from oasr.tokenizers.funasr_char import FunAsrCharTokenizer
from oasr.tokenizers.sentencepiece import SentencePieceTokenizer

from .conftest import TEXT


# -- sentencepiece ------------------------------------------------------------------------------------
@pytest.mark.reference
def test_sentencepiece_icefall_model_matches_the_library(fixtures_dir):
    lang = fixtures_dir / "zipformer_ctc" / "data" / "lang_bpe_500"
    ours = build_tokenizer(TokenizerSpec("sentencepiece", {"model": "bpe.model"}), lang)
    ref = spm.SentencePieceProcessor(model_file=str(lang / "bpe.model"))
    # <blk> and <sos/eos> are user-defined pieces in icefall's model, <unk> the unknown piece
    assert {ours.id_to_piece(i) for i in ours.special_ids} == {"<blk>", "<sos/eos>", "<unk>"}
    for text in ("HELLO WORLD", "THE QUICK BROWN FOX'S JUMP", "  SPACES  AROUND  "):
        assert ours.encode(text) == ref.encode(text)
        assert ours.encode(text.lower()) == ref.encode(text)  # the model is upper case
        assert ours.decode(ref.encode(text)) == ref.decode(ref.encode(text))
    rng = random.Random(1)
    for _ in range(300):
        ids = [rng.randrange(3, 500) for _ in range(rng.randint(0, 15))]
        assert ours.decode(ids) == ref.decode(ids)
        assert ours.decode([0, *ids, 1, 2]) == ref.decode(ids)


@pytest.mark.reference
def test_sentencepiece_byte_fallback_matches_the_library(sp_byte_model):
    ours = SentencePieceTokenizer(sp_byte_model)
    ref = spm.SentencePieceProcessor(model_proto=sp_byte_model)
    for text in TEXT + ["unseen 漢字 ✓ ♞"]:
        assert ours.encode(text) == ref.encode(text)
        assert ours.decode(ref.encode(text)) == ref.decode(ref.encode(text))
    rng = random.Random(2)
    for _ in range(300):
        ids = [rng.randrange(3, ours.vocab_size) for _ in range(rng.randint(0, 15))]
        assert ours.decode(ids) == ref.decode(ids).replace("\ufffd", "")


# -- huggingface --------------------------------------------------------------------------------------
def _trained_tokenizers():
    from tokenizers import AddedToken, SentencePieceBPETokenizer, Tokenizer, decoders, models, pre_tokenizers, trainers

    byte_level = Tokenizer(models.BPE())
    byte_level.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    byte_level.decoder = decoders.ByteLevel()
    byte_level.train_from_iterator(TEXT * 10, trainers.BpeTrainer(vocab_size=400, show_progress=False,
                                                                   initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    wordpiece = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wordpiece.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    wordpiece.decoder = decoders.WordPiece()
    wordpiece.train_from_iterator(TEXT * 10, trainers.WordPieceTrainer(vocab_size=300, show_progress=False,
                                                                       special_tokens=["[UNK]"]))
    metaspace = SentencePieceBPETokenizer()
    metaspace.train_from_iterator(TEXT * 10, vocab_size=300, show_progress=False)
    out = {}
    for name, tok in (("byte_level", byte_level), ("wordpiece", wordpiece), ("metaspace", metaspace)):
        tok.add_special_tokens([AddedToken("<blank>", special=True), AddedToken("<|endoftext|>", special=True)])
        tok.add_tokens([AddedToken("<laugh>", special=False)])
        out[name] = Tokenizer.from_str(tok.to_str())
    return out


@pytest.mark.reference
@pytest.mark.parametrize("name", ["byte_level", "wordpiece", "metaspace"])
def test_huggingface_matches_the_tokenizers_library(name, tmp_path):
    ref = _trained_tokenizers()[name]
    ref.save(str(tmp_path / "tokenizer.json"))
    blank_past_vocab = ref.get_vocab_size() + 3
    ours = build_tokenizer(TokenizerSpec("huggingface", {"tokenizer": "tokenizer.json"},
                                         special_ids=(blank_past_vocab,)), tmp_path)
    specials = {ref.token_to_id("<blank>"), ref.token_to_id("<|endoftext|>"), blank_past_vocab}
    if name != "byte_level":  # the trainers add their unknown token as a special
        specials.add(ref.token_to_id("[UNK]" if name == "wordpiece" else "<unk>"))
    assert ours.special_ids == specials
    for text in TEXT + ["a <laugh> b", "ü ñ 😀"]:
        ids = ours.encode(text)
        assert ids == ref.encode(text, add_special_tokens=False).ids
        assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True)
    rng = random.Random(3)
    size = ref.get_vocab_size()
    for _ in range(300):
        ids = [rng.randrange(size) for _ in range(rng.randint(0, 12))]
        expected = ref.decode(ids, skip_special_tokens=True).replace("\ufffd", "")
        assert ours.decode(ids + [blank_past_vocab]) == expected


# -- symbol_table -------------------------------------------------------------------------------------
@pytest.mark.reference
def test_symbol_table_of_icefall_tokens_matches_sentencepiece(fixtures_dir):
    lang = fixtures_dir / "zipformer_ctc" / "data" / "lang_bpe_500"
    ours = build_tokenizer(TokenizerSpec("symbol_table", {"units": "tokens.txt", "bpe_model": "bpe.model"}), lang)
    ref = spm.SentencePieceProcessor(model_file=str(lang / "bpe.model"))
    assert ours.vocab_size == 502
    assert {ours.id_to_piece(i) for i in ours.special_ids} == {"<blk>", "<sos/eos>", "<unk>", "#0", "#1"}
    rng = random.Random(4)
    for _ in range(300):
        ids = [rng.randrange(3, 500) for _ in range(rng.randint(0, 15))]
        # WeNet/icefall print the pieces joined, word boundaries as spaces, stripped
        assert ours.decode(ids) == ref.decode(ids).strip()
        assert ours.decode([0, *ids, 500, 1]) == ref.decode(ids).strip()
    for text in ("hello world", "THE FOX"):
        assert ours.encode(text) == ref.encode(text.upper())


def test_symbol_table_of_wenet_units(fixtures_dir):
    units = fixtures_dir / "wenet_u2pp" / "model" / "units.txt"
    table = dict(line.split() for line in units.read_text(encoding="utf-8").splitlines())
    ids = {piece: int(i) for piece, i in table.items()}
    ours = build_tokenizer(TokenizerSpec("symbol_table", {"units": units.name}), units.parent)
    assert ours.special_ids == {ids["<blank>"], ids["<unk>"], ids["<sos/eos>"]}
    seq = [ids[p] for p in ["▁", "h", "i", "▁", "你", "好", "<unk>", "▁", "0", "'", "s", "▁"]]
    assert ours.decode(seq) == "hi 你好 0's"
    assert ours.encode("hi 你好") == [ids[p] for p in ["h", "i", "▁", "你", "好"]]


# -- funasr_char --------------------------------------------------------------------------------------
FUNASR_VOCAB = ["<blank>", "<s>", "</s>", "中", "国", "人", "你", "好", "1", "2", "@", "a", "b", "c", "i", "hello",
                "world", "hel@@", "wor@@", "lo", "ld", "'", "it's", ",", "。", "?", "é", "Ab", "d@@", "1中", "@中",
                "中a", "@@", "\n", "中国", " ", "a b", "<unk>"]


@pytest.fixture(scope="module")
def funasr_tokenizer(tmp_path_factory):
    root = tmp_path_factory.mktemp("funasr")
    (root / "tokens.json").write_text(json.dumps(FUNASR_VOCAB, ensure_ascii=False), encoding="utf-8")
    return build_tokenizer(TokenizerSpec("funasr_char", {"tokens": "tokens.json"}), root)


@pytest.mark.reference
@settings(max_examples=600, deadline=None)
@given(ids=st.lists(st.integers(0, len(FUNASR_VOCAB) - 1), max_size=12))
def test_funasr_postprocess_matches_funasr(funasr_tokenizer, ids):
    from funasr.utils.postprocess_utils import sentence_postprocess

    # what Paraformer does: drop blank/sos/eos ids, map to tokens, post-process
    tokens = [FUNASR_VOCAB[i] for i in ids if i not in (0, 1, 2)]
    expected = sentence_postprocess(tokens)[0]
    assert funasr_tokenizer.decode(ids) == expected
    assert "".join(funasr_tokenizer.token_pieces(ids)) == expected


@pytest.mark.reference
def test_funasr_examples_and_token_list_formats(tmp_path):
    from funasr.utils.postprocess_utils import sentence_postprocess

    vocab = [t for t in FUNASR_VOCAB if t.strip() == t and t]  # one token per line
    (tmp_path / "tokens.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tok = FunAsrCharTokenizer.from_spec(TokenizerSpec("funasr_char", {"tokens": "tokens.txt"}), tmp_path)
    ids = {t: i for i, t in enumerate(vocab)}
    cases = [["你", "好", "hel@@", "lo", "world", "中", "国"], ["a", "b", "c", "hello"], ["i", "it's", "1", "2"]]
    for tokens in cases:
        assert tok.decode([ids[t] for t in tokens]) == sentence_postprocess(tokens)[0]
    assert tok.decode([ids[t] for t in cases[0]]) == "你好hello world中国"
    assert tok.decode([ids[t] for t in cases[1]]) == "ABC hello"
    assert tok.encode("你好 hello") == [ids["你"], ids["好"], ids["hello"]]
    assert tok.decode(tok.encode("中国人 hello world")) == "中国人hello world"
    assert tok.vocab_size == len(vocab) and tok.id_to_piece(ids["hel@@"]) == "hel@@"
