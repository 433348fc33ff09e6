"""A `.nemo` TDT archive's ``decoding`` section becomes the checkpoint's decoding defaults: NeMo's beam
searches are taken, and a strategy OASR does not implement decodes greedily with a warning naming it."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from oasr.models.specs import DecodingDefaults
from oasr_models_hf.fastconformer.nemo_convert import tdt_decoding_defaults

GREEDY = DecodingDefaults(decode_type="transducer", blank_id=8, options={"max_symbols": 10})


@pytest.mark.parametrize(("strategy", "search"), [("beam", "modified_beam"), ("maes", "maes")])
def test_beam_strategies_become_the_default_search(strategy, search):
    got = tdt_decoding_defaults(Path("m.nemo"), {"decoding": {"strategy": strategy, "beam": {"beam_size": 3}}},
                                GREEDY)
    assert got.options == {"max_symbols": 10, "search": search, "beam_size": 3}


@pytest.mark.parametrize("strategy", [None, "greedy", "greedy_batch"])
def test_greedy_strategies_decode_greedily_without_a_warning(strategy, caplog):
    with caplog.at_level(logging.WARNING):
        got = tdt_decoding_defaults(Path("m.nemo"), {"decoding": {"strategy": strategy}}, GREEDY)
    assert got is GREEDY and not caplog.records


def test_an_unimplemented_strategy_is_named_in_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        got = tdt_decoding_defaults(Path("m.nemo"), {"decoding": {"strategy": "malsd_batch"}}, GREEDY)
    assert got is GREEDY
    assert any("malsd_batch" in r.getMessage() and "m.nemo" in r.getMessage() for r in caplog.records)
