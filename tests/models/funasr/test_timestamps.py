"""CIF timestamps: the word items and milliseconds FunASR prints, in ``RequestOutput.words``.

BiCifParaformer prints timestamps by default (from its upsampled timestamp head); a plain Paraformer
prints them with ``output_timestamp=True`` (from its predictor's own alphas).  Both are compared with
``AutoModel.generate`` on each clip alone, to the millisecond.
"""

from __future__ import annotations

import pytest
import torch

import oasr
from oasr.engine.options import DecodingOptions
from oasr_models_funasr.predictor import cif_fires
from oasr_models_funasr.timestamps import token_timestamps
from oasr_models_funasr.words import funasr_words
from tests.models.funasr import _helpers as h
from tests.models.funasr.conftest import VARIANTS

WORDS = DecodingOptions(word_timestamps=True)


@pytest.fixture(scope="module")
def engines(model_dirs):
    return {key: oasr.Engine(oasr.EngineConfig(model=str(path))) for key, path in model_dirs.items()}


def _ms(words) -> list[list[int]]:
    return [[round(w.start * 1000), round(w.end * 1000)] for w in words]


@pytest.mark.parametrize("variant", VARIANTS, ids=["-".join(v) for v in VARIANTS])
def test_word_times_equal_funasr_generate(variant, engines, references, clips):
    engine = engines[variant]
    bicif = variant[0] == "BiCifParaformer"
    timed = 0
    for name, audio in clips:
        (ours,) = [engine.transcribe_outputs([audio], decoding=WORDS)[0]]
        (theirs,) = h.generate(references[variant], [audio], **({} if bicif else {"output_timestamp": True}))
        assert ours.words is not None, name
        assert [w.word for w in ours.words] == theirs["text"].split(" "), name
        assert _ms(ours.words) == theirs["timestamp"], name
        if bicif:
            assert ours.text == theirs["text"], name
        assert all(w.start <= w.end for w in ours.words)
        timed += len(ours.words)
    assert timed > 20


def test_bicif_transcript_is_timed_without_asking(engines, references, clips):
    """BiCif prints space-joined word items whether or not words are asked for, as FunASR does."""
    _, audio = clips[0]
    plain = engines[("BiCifParaformer", "small")].transcribe_outputs([audio])[0]
    (theirs,) = h.generate(references[("BiCifParaformer", "small")], [audio])
    assert plain.text == theirs["text"] and " " in plain.text
    assert plain.words is None  # the field is filled only on request


def test_token_timestamp_rules():
    """FunASR's rules on a hand-made alpha track: fires shifted by 1.5 frames, 60 ms / 3 per frame,
    a long gap cut to 12 frames, the end halfway to the last frame after a long tail."""
    alphas = torch.zeros(60)
    for frame in (8, 12, 40):  # three fires: two tokens
        alphas[frame] = 1.0
    peaks = cif_fires(alphas[None], 1.0 - 1e-4)[0]
    spans = token_timestamps(alphas, peaks, 2, upsample_rate=3)
    rate = 20  # ms per upsampled frame
    assert spans == [(int(6.5 * rate), int(10.5 * rate)), (int(10.5 * rate), int((10.5 + 12) * rate))]


def test_word_items_follow_funasr():
    times = [[0, 10], [10, 20], [20, 30], [30, 40], [40, 50], [50, 60]]
    assert funasr_words(["的", "一", "是"], times[:3]) == (["的", "一", "是"], times[:3])
    assert funasr_words(["hel@@", "lo", "the"], times[:3]) == (["hello", "the"], [[0, 20], [20, 30]])
    assert funasr_words(["的", "hel@@", "lo", "是"], times[:4]) == (["的", "hello", "是"], [[0, 10], [10, 30], [30, 40]])
    # single letters become one upper-case abbreviation spanning its letters
    assert funasr_words(["的", "b", "c", "d", "是"], times[:5]) == (["的", "BCD", "是"], [[0, 10], [10, 40], [40, 50]])
