"""``oasr models`` / ``oasr plugins`` show why a plugin's code cannot be imported.

Two ways a plugin breaks: its entry-point module raises on import (the ``oasr-broken`` test
distribution), or the module imports and registers ``"module:attr"`` strings that name code which does
not import (a typo, a missing dependency). Neither may be listed as a working model ("converter yes").
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from oasr import hookimpl, plugins
from oasr.cli import main
from tests.helpers import PLUGINS, run_python, tinyctc_registered


@pytest.fixture(scope="module")
def broken_site(tmp_path_factory) -> Path:
    """``tests/plugins/oasr-broken`` pip-installed into a private site dir."""
    work = tmp_path_factory.mktemp("broken")
    src = work / "oasr-broken"
    shutil.copytree(PLUGINS / "oasr-broken", src, ignore=shutil.ignore_patterns("*.egg-info", "build", "__pycache__"))
    site = work / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                    "--no-build-isolation", "--target", str(site), str(src)],
                   check=True, capture_output=True, text=True, timeout=300)
    return site


def test_oasr_models_names_a_plugin_that_failed_to_import(broken_site):
    result = run_python("import sys; from oasr.cli import main; sys.exit(main(['models']))", pythonpath=[broken_site])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = lines.index(next(line for line in lines if line.startswith("plugin not loaded")))
    row = next(line for line in lines[header:] if line.startswith("broken "))
    assert "oasr-broken" in row and "import failed: RuntimeError: oasr-broken refuses to import" in row
    # the working families are still listed as working
    conformer = next(line for line in lines if line.startswith("conformer "))
    assert conformer.split()[1:3] == ["oasr-models-wenet", "yes"]


def test_without_a_broken_plugin_oasr_models_has_no_error_section(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "plugin not loaded" not in out and "failed to import" not in out
    assert out.splitlines()[0].split() == ["architecture", "distribution", "converter", "description"]


class _LazyBrokenPlugin:
    """Imports fine; its model's module and converter name a dependency that is not installed."""

    @hookimpl
    def oasr_register_models(self, register):
        register("lazybroken", model="oasr_lazybroken_missing_dep.model:LazyModel",
                 config="oasr_lazybroken_missing_dep.model:LazyConfig",
                 converter="oasr_lazybroken_missing_dep.convert:LazyConverter", description="half-typed-in plugin")


@pytest.fixture
def lazy_broken():
    plugins.register_plugin(_LazyBrokenPlugin(), name="lazybroken", distribution="oasr-lazybroken")
    try:
        yield
    finally:
        plugins.unregister_plugin("lazybroken")


def test_a_registered_model_whose_code_does_not_import_is_not_converter_yes(lazy_broken, capsys):
    with tinyctc_registered():
        assert main(["models"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("lazybroken "))
    assert row.split()[1:3] == ["oasr-lazybroken", "error"]
    assert "ModuleNotFoundError" in row and "oasr_lazybroken_missing_dep" in row
    good = next(line for line in out.splitlines() if line.startswith("tinyctc "))
    assert good.split()[2] == "yes"


def test_oasr_plugins_shows_the_import_error_and_strict_fails(lazy_broken, capsys):
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("lazybroken "))
    assert "model:lazybroken" in row
    assert "model 'lazybroken': oasr_lazybroken_missing_dep.model:LazyModel failed to import: ModuleNotFoundError" in row
    assert main(["plugins", "--strict"]) == 1
    capsys.readouterr()


def test_oasr_plugins_strict_passes_when_every_target_imports(capsys):
    with tinyctc_registered():
        assert main(["plugins", "--strict"]) == 0
    out = capsys.readouterr().out
    assert "failed to import" not in out
