"""Helpers shared by tests (importable as ``tests.helpers`` or ``helpers``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLUGINS = REPO / "tests" / "plugins"
TINYCTC_SRC = PLUGINS / "oasr-tinyctc" / "src"


def ensure_tinyctc_importable() -> None:
    """Make the example plugin's source importable in this process (without installing it)."""
    if str(TINYCTC_SRC) not in sys.path:
        sys.path.insert(0, str(TINYCTC_SRC))


def run_python(code: str, *, env: dict[str, str] | None = None, pythonpath: list[Path] = (),
               timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter of this environment (clean plugin discovery)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    if pythonpath:
        full_env["PYTHONPATH"] = os.pathsep.join([*map(str, pythonpath), full_env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env,
                          timeout=timeout)
