"""build_tokenizer: the registry, spec file resolution, and the errors a bad spec or id gets."""

from __future__ import annotations

import json

import pytest

from oasr.errors import CheckpointFormatError, OasrError, UnknownComponentError
from oasr.models import TokenizerSpec
from oasr.tokenizers import Tokenizer, TokenizerError, build_tokenizer
from oasr.tokenizers.funasr_char import FunAsrCharTokenizer
from oasr.tokenizers.huggingface import HuggingFaceTokenizer
from oasr.tokenizers.sentencepiece import SentencePieceTokenizer
from oasr.tokenizers.symbol_table import SymbolTableTokenizer
from oasr.tokenizers.whisper import WhisperTokenizer


def test_every_core_kind_builds_from_its_spec(fixtures_dir, tmp_path, whisper_en_json):
    icefall = fixtures_dir / "zipformer_ctc" / "data" / "lang_bpe_500"
    (tmp_path / "tokens.json").write_text(json.dumps(["<blank>", "<s>", "</s>", "你", "好", "<unk>"]))
    cases = [
        (TokenizerSpec("symbol_table", {"units": "units.txt"}), fixtures_dir / "wenet_u2pp" / "model", SymbolTableTokenizer),
        (TokenizerSpec("sentencepiece", {"model": "bpe.model"}), icefall, SentencePieceTokenizer),
        (TokenizerSpec("huggingface", {"tokenizer": str(whisper_en_json)}), None, HuggingFaceTokenizer),
        (TokenizerSpec("whisper", {"tokenizer": "tokenizer.json"}), whisper_en_json.parent, WhisperTokenizer),
        (TokenizerSpec("funasr_char", {"tokens": "tokens.json"}), tmp_path, FunAsrCharTokenizer),
    ]
    for spec, root, cls in cases:
        tok = build_tokenizer(spec, root)
        assert type(tok) is cls and tok.kind == spec.kind
        assert isinstance(tok, Tokenizer) and tok.vocab_size > 0
    assert build_tokenizer(cases[-1][0], tmp_path).decode([3, 4, 2]) == "你好"


def test_unknown_kind_lists_registered_kinds():
    with pytest.raises(UnknownComponentError) as err:
        build_tokenizer(TokenizerSpec("klingon", {"x": "y"}), None)
    message = str(err.value)
    assert "klingon" in message
    for kind in ("symbol_table", "sentencepiece", "huggingface", "whisper", "funasr_char"):
        assert kind in message


def test_missing_file_and_missing_role_are_named(tmp_path):
    with pytest.raises(CheckpointFormatError, match="units.txt"):
        build_tokenizer(TokenizerSpec("symbol_table", {"units": "units.txt"}), tmp_path)
    with pytest.raises(CheckpointFormatError, match="'model'"):
        build_tokenizer(TokenizerSpec("sentencepiece", {"a": "x", "b": "y"}), tmp_path)


def test_malformed_symbol_table_names_the_line(tmp_path):
    (tmp_path / "units.txt").write_text("<blank> 0\na 1\nbroken\n")
    with pytest.raises(CheckpointFormatError, match=r"units.txt:3"):
        build_tokenizer(TokenizerSpec("symbol_table", {"units": "units.txt"}), tmp_path)


def test_out_of_range_id_is_an_error_but_declared_specials_pass(fixtures_dir):
    spec = TokenizerSpec("symbol_table", {"units": "units.txt"}, special_ids=(50,))
    tok = build_tokenizer(spec, fixtures_dir / "wenet_u2pp" / "model")
    assert tok.vocab_size == 50
    assert tok.decode([2, 50, 3]) == "ab"  # 50 lies past the table but the spec declares it special
    with pytest.raises(TokenizerError, match="51") as err:
        tok.decode([2, 51])
    assert isinstance(err.value, OasrError) and err.value.token_id == 51


def test_a_kind_without_encoder_says_so():
    class Pieces(Tokenizer):
        kind = "pieces"

        def _decode_raw(self, ids):
            return "".join("ab"[i] for i in ids)

    tok = Pieces(vocab_size=2)
    assert tok.decode([0, 1, 1]) == "abb"
    with pytest.raises(TokenizerError, match="cannot encode"):
        tok.encode("ab")
