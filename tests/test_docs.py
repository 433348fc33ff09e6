"""The generated reference pages (CLI help, registries) match the code."""

from __future__ import annotations

import importlib.util

from tests.helpers import REPO


def test_generated_pages_are_current():
    spec = importlib.util.spec_from_file_location("gen_docs", REPO / "scripts" / "gen_docs.py")
    gen_docs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen_docs)
    stale = gen_docs.stale_pages()
    assert stale == [], f"regenerate with `python scripts/gen_docs.py --write`: {stale}"
