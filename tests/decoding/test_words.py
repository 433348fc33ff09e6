"""Word timings on constructed CTC alignments: exact times and confidences, CJK per character."""

from __future__ import annotations

import pytest
import torch

from oasr.decoding.ctc import ctc_greedy_search
from oasr.decoding.words import ctc_alignment_spans, ctc_token_confidences, split_words, words_from_tokens
from oasr.errors import ConfigError
from oasr.models import TokenizerSpec
from oasr.tokenizers import build_tokenizer

SHIFT, OFFSET = 0.04, 1.0


def constructed_log_probs(path, posterior, vocab):
    """Frame t gives label path[t] the posterior ``posterior[t]``; the rest share what is left."""
    probs = torch.empty(len(path), vocab, dtype=torch.float64)
    for t, (label, p) in enumerate(zip(path, posterior, strict=True)):
        probs[t] = (1.0 - p) / (vocab - 1)
        probs[t, label] = p
    return probs.log()


@pytest.fixture(scope="module")
def wenet_units(fixtures_dir):
    tok = build_tokenizer(TokenizerSpec("symbol_table", {"units": "units.txt"}), fixtures_dir / "wenet_u2pp" / "model")
    ids = {tok.id_to_piece(i): i for i in range(tok.vocab_size)}
    return tok, ids


def test_words_on_a_constructed_alignment(wenet_units):
    tok, ids = wenet_units
    labels = ["<blank>", "h", "h", "i", "<blank>", "▁", "你", "<blank>", "好", "好", "<blank>", "▁", "o", "k", "<blank>"]
    posterior = [0.9, 0.6, 0.8, 0.7, 0.9, 0.5, 0.95, 0.9, 0.4, 0.6, 0.9, 0.55, 0.85, 0.65, 0.9]
    path = [ids[p] for p in labels]
    log_probs = constructed_log_probs(path, posterior, tok.vocab_size)

    tokens, starts, ends = ctc_alignment_spans(path, blank=0)
    assert [tok.id_to_piece(t) for t in tokens] == ["h", "i", "▁", "你", "好", "▁", "o", "k"]
    assert (starts, ends) == ([1, 3, 5, 6, 8, 11, 12, 13], [3, 4, 6, 7, 10, 12, 13, 14])
    # a token's confidence: its highest posterior over the frames it spans
    confidences = ctc_token_confidences(log_probs, tokens, starts, ends)
    assert confidences == pytest.approx([0.8, 0.7, 0.5, 0.95, 0.6, 0.55, 0.85, 0.65], rel=1e-12)

    words = words_from_tokens(tokens, starts, confidences, tok, SHIFT, token_end_frames=ends, offset_seconds=OFFSET)
    text = tok.decode(tokens)
    assert text == "hi 你好 ok"
    expected = [  # word, first frame, end frame (last emitting frame + 1), token confidences
        ("hi", 1, 4, [0.8, 0.7]),
        ("你", 6, 7, [0.95]),
        ("好", 8, 10, [0.6]),
        ("ok", 12, 14, [0.85, 0.65]),
    ]
    assert [w.word for w in words] == [e[0] for e in expected]
    for word, (_, first, end, confs) in zip(words, expected, strict=True):
        assert word.word in text
        assert word.start == first * SHIFT + OFFSET
        assert word.end == end * SHIFT + OFFSET
        assert word.confidence == pytest.approx(sum(confs) / len(confs), rel=1e-12)
    low = words_from_tokens(tokens, starts, confidences, tok, SHIFT, token_end_frames=ends, aggregate="min")
    assert [w.confidence for w in low] == pytest.approx([0.7, 0.95, 0.6, 0.65], rel=1e-12)
    assert low[0].start == 1 * SHIFT and low[0].end == 4 * SHIFT


def test_greedy_output_feeds_word_timings(wenet_units):
    tok, ids = wenet_units
    labels = ["<blank>", "a", "a", "<blank>", "b", "▁", "c", "c", "c", "<blank>"]
    posterior = [0.9, 0.6, 0.8, 0.7, 0.9, 0.5, 0.7, 0.95, 0.6, 0.9]
    log_probs = constructed_log_probs([ids[p] for p in labels], posterior, tok.vocab_size).float()
    hyp = ctc_greedy_search(log_probs[None], [len(labels)])[0]
    assert hyp.token_frames == [1, 4, 5, 6]
    assert hyp.token_confidences == pytest.approx([0.8, 0.9, 0.5, 0.95], rel=1e-6)
    # without end frames a token spans one frame: "ab" ends at b's frame + 1, "c" at its first frame + 1
    words = words_from_tokens(hyp.tokens, hyp.token_frames, hyp.token_confidences, tok, SHIFT)
    assert [(w.word, w.start, w.end) for w in words] == [("ab", 1 * SHIFT, 5 * SHIFT), ("c", 6 * SHIFT, 7 * SHIFT)]
    assert words[0].confidence == pytest.approx((0.8 + 0.9) / 2, rel=1e-6)


def test_byte_level_character_split_over_tokens(whisper_multilingual_json):
    tok = build_tokenizer(TokenizerSpec("whisper", {"tokenizer": str(whisper_multilingual_json)}), None)
    tokens = tok.encode(" 鬱你好，世界 ok")
    assert tok.decode(tokens) == " 鬱你好，世界 ok"
    frames = list(range(0, 3 * len(tokens), 3))
    confidences = [0.5 + 0.01 * i for i in range(len(tokens))]
    words = words_from_tokens(tokens, frames, confidences, tok, SHIFT)
    assert [w.word for w in words] == ["鬱", "你", "好，", "世", "界", "ok"]
    pieces = tok.token_pieces(tokens)
    owner = [i for i, p in enumerate(pieces) for _ in p]
    text = "".join(pieces)
    for word in words:
        start = text.index(word.word)
        first, last = owner[start], owner[start + len(word.word) - 1]
        while first > 0 and pieces[first - 1] == "":  # bytes that started the character
            first -= 1
        assert word.start == frames[first] * SHIFT
        assert word.end == (frames[last] + 1) * SHIFT
        assert word.confidence == pytest.approx(sum(confidences[first:last + 1]) / (last - first + 1))
    # " 鬱" is three byte-level tokens (a space, then the character's bytes in two): the word starts at
    # the frame of the token holding its first byte
    assert pieces[:3] == [" ", "", "鬱"] and words[0].start == frames[1] * SHIFT


def test_sentencepiece_words_span_their_pieces(fixtures_dir):
    tok = build_tokenizer(TokenizerSpec("sentencepiece", {"model": "bpe.model"}),
                          fixtures_dir / "zipformer_ctc" / "data" / "lang_bpe_500")
    tokens = tok.encode("HELLO WORLDWIDE OK")
    frames = [2 * i + 1 for i in range(len(tokens))]
    words = words_from_tokens(tokens, frames, None, tok, 0.03)
    assert [w.word for w in words] == ["HELLO", "WORLDWIDE", "OK"]
    assert all(w.confidence is None for w in words)
    pieces = [tok.id_to_piece(t) for t in tokens]
    starts = [i for i, p in enumerate(pieces) if p.startswith("▁")]
    bounds = list(zip(starts, [*starts[1:], len(tokens)], strict=True))
    for word, (first, stop) in zip(words, bounds, strict=True):
        assert word.start == frames[first] * 0.03 and word.end == (frames[stop - 1] + 1) * 0.03


def test_split_words_rules():
    text = "你好，世界 hello, world  日本語テキスト x"
    assert [text[a:b] for a, b in split_words(text)] == \
        ["你", "好，", "世", "界", "hello,", "world", "日", "本", "語", "テ", "キ", "ス", "ト", "x"]


def test_mismatched_lengths_are_refused(wenet_units):
    tok, _ = wenet_units
    with pytest.raises(ConfigError, match="one frame"):
        words_from_tokens([2, 3], [0], None, tok, SHIFT)
    with pytest.raises(ConfigError, match="aggregate"):
        words_from_tokens([2], [0], [0.5], tok, SHIFT, aggregate="max")
