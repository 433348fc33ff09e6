"""Helpers shared by tests (importable as ``tests.helpers`` or ``helpers``)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from oasr.layers.quant import _vnni

REPO = Path(__file__).resolve().parents[1]
PLUGINS = REPO / "tests" / "plugins"
TINYCTC_SRC = PLUGINS / "oasr-tinyctc" / "src"
TOYFAMILY_SRC = PLUGINS / "oasr-toyfamily" / "src"


def nemo_python() -> Path:
    """NeMo's own venv's python (scripts/test.sh builds it; ``OASR_NEMO_PYTHON`` overrides); a missing one
    fails the test naming the install line."""
    python = Path(os.environ.get("OASR_NEMO_PYTHON", REPO / ".cache" / "nemo-venv" / "bin" / "python"))
    if not python.is_file():
        raise AssertionError(f"NeMo's venv is missing ({python}): python -m venv .cache/nemo-venv && "
                             f".cache/nemo-venv/bin/pip install torch==2.13.0 'nemo_toolkit[asr]' "
                             f"(or set OASR_NEMO_PYTHON)")
    return python


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


@contextlib.contextmanager
def registered_model(name: str, model: str, config: str, converter):
    """Register an architecture for the duration of a block, restoring whatever was there before
    (tests share one registry per process, so a test must not remove another test's registration)."""
    from oasr import plugins

    models = plugins.registry("models")
    previous = models.remove(name)
    models.add(name, model, distribution="tests", config=config, converter=converter, description="")
    try:
        yield
    finally:
        models.remove(name)
        if previous is not None:
            models.put(previous)


def tinyctc_registered(converter="oasr_tinyctc.convert:TinyCtcConverter"):
    """The example plugin's ``tinyctc`` architecture, registered in-process for a block."""
    ensure_tinyctc_importable()
    return registered_model("tinyctc", "oasr_tinyctc.model:TinyCtcModel", "oasr_tinyctc.model:TinyCtcConfig",
                            converter)


@contextlib.contextmanager
def toyfamily_registered():
    """The example family plugin (``toyframe`` + its ``framewise`` decode family) for a block: the
    installed distribution when it is installed, else its source registered in-process."""
    from oasr import plugins

    if "toyframe" in plugins.registry("models"):
        yield
        return
    if str(TOYFAMILY_SRC) not in sys.path:
        sys.path.insert(0, str(TOYFAMILY_SRC))
    import oasr_toyfamily.plugin

    plugins.register_plugin(oasr_toyfamily.plugin, name="toyfamily-tests", distribution="oasr-toyfamily")
    try:
        yield
    finally:
        plugins.unregister_plugin("toyfamily-tests")


#: a test of the ``int8_linear`` kernel, which runs where VNNI sums int8 in int32 (``oasr.layers.quant.int8_block``
#: declines elsewhere); its reason is the one scripts/test_floor.py's ``CPU_SKIPS`` knows
needs_vnni = pytest.mark.skipif(not _vnni(), reason="the int8_linear kernel runs where VNNI sums int8 in int32")
