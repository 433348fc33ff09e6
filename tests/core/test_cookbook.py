"""docs/plugins.md works when typed in literally: its code blocks, written to the files their first line
names, make a distribution that pip installs, that ``oasr models`` lists, and whose usage script runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.helpers import REPO

BLOCK = re.compile(r"```(?:python|toml)\n# FILE: (\S+)\n(.*?)```", re.S)


def cookbook_files() -> dict[str, str]:
    text = (REPO / "docs" / "plugins.md").read_text(encoding="utf-8")
    return {path: body for path, body in BLOCK.findall(text)}


def test_the_cookbook_names_every_file_of_its_layout():
    files = cookbook_files()
    assert set(files) == {"oasr-toyctc/pyproject.toml", "oasr-toyctc/src/oasr_toyctc/__init__.py",
                          "oasr-toyctc/src/oasr_toyctc/plugin.py", "oasr-toyctc/src/oasr_toyctc/model.py",
                          "oasr-toyctc/src/oasr_toyctc/convert.py", "use_toyctc.py"}


def test_the_cookbook_installs_lists_and_runs(tmp_path):
    for rel, body in cookbook_files().items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body, encoding="utf-8")
    target = tmp_path / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--quiet",
                          "--target", str(target), str(tmp_path / "oasr-toyctc")], capture_output=True, text=True,
                         timeout=300)
    assert pip.returncode == 0, pip.stderr
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")])}
    env.pop("OASR_PLUGINS", None)
    models = subprocess.run([sys.executable, "-m", "oasr.cli", "models"], capture_output=True, text=True, env=env,
                            timeout=300)
    assert models.returncode == 0, models.stderr
    row = next(line for line in models.stdout.splitlines() if line.startswith("toyctc "))
    assert row.split()[1:3] == ["oasr-toyctc", "yes"]
    plugins = subprocess.run([sys.executable, "-m", "oasr.cli", "plugins", "--strict"], capture_output=True,
                             text=True, env=env, timeout=300)
    assert "oasr-toyctc" in plugins.stdout
    use = subprocess.run([sys.executable, "use_toyctc.py"], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=300)
    assert use.returncode == 0, use.stderr
    assert use.stdout.startswith("ToyCtcModel '")
