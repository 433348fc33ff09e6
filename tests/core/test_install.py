"""The install story: ``python -m build`` makes a wheel of every distribution, and the README's
``pip install --find-links dist "oasr-core[hf,serve]"`` works in a fresh virtual environment.

The fresh venv sees this machine's third-party packages (torch, fastapi, ...) through a ``.pth`` file
pointing at a folder of links to them, with every OASR distribution left out, so pip installs OASR
itself only from the wheel folder (``--no-index``: nothing comes from an index) and resolves the
extras against what is there.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.helpers import REPO

DISTRIBUTIONS = ("oasr-core", "oasr-kernels", "oasr-models-wenet", "oasr-models-icefall", "oasr-models-hf",
                 "oasr-models-funasr")


def _run(args, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=900, **kwargs)
    assert result.returncode == 0, f"{args}: {result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    return result


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    for name in DISTRIBUTIONS:
        _run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", dist, REPO / name])
    return dist


def _third_party_only(tmp: Path) -> Path:
    """A folder of links to this interpreter's site-packages entries, minus every OASR distribution."""
    site = Path(sysconfig.get_paths()["purelib"])
    deps = tmp / "deps"
    deps.mkdir()
    for entry in site.iterdir():
        lowered = entry.name.lower()
        if lowered.startswith(("oasr", "__editable__", "_oasr")) or entry.suffix == ".pth":
            continue
        (deps / entry.name).symlink_to(entry)
    return deps


def test_every_distribution_builds_a_wheel(wheels):
    built = sorted(p.name.split("-")[0] for p in wheels.glob("*.whl"))
    assert built == sorted(n.replace("-", "_") for n in DISTRIBUTIONS)


def test_wheel_install_with_extras_in_a_fresh_venv(wheels, tmp_path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv])
    python = venv / "bin" / "python"
    purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    (Path(purelib) / "third_party.pth").write_text(str(_third_party_only(tmp_path)) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OASR_PLUGINS")}
    # the venv's own bundled setuptools would shadow the (newer) one torch requires
    _run([python, "-m", "pip", "uninstall", "-y", "-q", "setuptools"], env=env)
    # the README's command, offline: OASR only from the wheel folder
    _run([python, "-m", "pip", "install", "--no-index", "--find-links", wheels, "oasr-core[hf,serve]"], env=env,
         cwd=tmp_path)
    shown = _run([python, "-m", "pip", "list", "--format=freeze"], env=env).stdout
    assert "oasr-core==0.1.0" in shown and "oasr-models-hf==0.1.0" in shown
    assert "oasr-models-wenet" not in shown  # only the extras asked for
    files = _run([python, "-c", "import oasr, oasr_models_hf; print(oasr.__file__); print(oasr_models_hf.__file__)"],
                 env=env, cwd=tmp_path).stdout.split()
    assert all(str(venv) in f for f in files), files  # the wheels' copies, not the checkout
    models = _run([venv / "bin" / "oasr", "models"], env=env, cwd=tmp_path).stdout
    assert "whisper" in models and "oasr-models-hf" in models
    help_text = _run([venv / "bin" / "oasr", "serve", "--help"], env=env, cwd=tmp_path).stdout
    assert "--served-model-name" in help_text
    _run([python, "-c", "import uvicorn, fastapi, oasr.serve.app"], env=env, cwd=tmp_path)  # the [serve] extra
