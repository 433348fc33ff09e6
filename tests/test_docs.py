"""The generated reference pages (CLI help, registries) match the code."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import REPO


def test_generated_pages_are_current():
    # a fresh interpreter: this process's registries carry what other tests registered in-process
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "gen_docs.py")], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
