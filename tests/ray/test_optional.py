"""Ray is optional: ``import oasr`` and the CLI never import it, and a missing Ray is one clear error."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_import_oasr_and_the_cli_help_never_import_ray():
    code = ("import sys, oasr, oasr.cli, oasr.ray\n"
            "from oasr.cli import main\n"
            "try:\n    main(['transcribe', '--help'])\nexcept SystemExit:\n    pass\n"
            "assert 'ray' not in sys.modules, sorted(m for m in sys.modules if m.startswith('ray'))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_a_missing_ray_names_the_extra(monkeypatch, tmp_path):
    from oasr.errors import ConfigError
    from oasr.ray import require_ray, transcribe_dataset

    monkeypatch.setitem(sys.modules, "ray", None)  # what an environment without Ray looks like to import
    with pytest.raises(ConfigError, match=r'Ray is not installed .*pip install "oasr-core\[ray\]"'):
        require_ray("data")
    (tmp_path / "a.wav").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"oasr-core\[ray\]"):
        transcribe_dataset([tmp_path / "a.wav"], tmp_path / "out", model="unused", progress=False)
