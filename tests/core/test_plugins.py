"""Plugin discovery: lazy registration, third-party distributions, broken plugins, OASR_PLUGINS."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from oasr import hookimpl, plugins
from oasr.errors import PluginLoadError, UnknownModelError
from tests.helpers import PLUGINS, run_python

FAMILY_MODULE_PREFIXES = ("oasr_models_wenet", "oasr_models_icefall", "oasr_models_hf", "oasr_models_funasr",
                          "oasr_kernels")


def test_import_and_list_models_import_no_family_model_code():
    result = run_python(textwrap.dedent("""
        import json, sys
        import oasr
        names = oasr.list_models()
        from oasr import plugins
        dists = sorted({r.distribution for r in plugins.plugin_records()})
        print(json.dumps({"names": names, "modules": sorted(sys.modules), "dists": dists}))
    """))
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout.strip().splitlines()[-1])
    # every family distribution was discovered...
    for dist in ("oasr-models-wenet", "oasr-models-icefall", "oasr-models-hf", "oasr-models-funasr", "oasr-kernels"):
        assert dist in data["dists"]
    # ...but nothing beyond each family's package and its plugin module was imported
    family_modules = [m for m in data["modules"] if m.startswith(FAMILY_MODULE_PREFIXES)]
    allowed = {p for p in FAMILY_MODULE_PREFIXES} | {f"{p}.plugin" for p in FAMILY_MODULE_PREFIXES}
    assert set(family_modules) <= allowed, sorted(set(family_modules) - allowed)
    for heavy in ("transformers", "funasr", "ctranslate2", "numba"):
        assert heavy not in data["modules"]


@pytest.fixture(scope="module")
def installed_plugins(tmp_path_factory) -> Path:
    """Create two throwaway plugin distributions and pip-install them into a private site dir."""
    work = tmp_path_factory.mktemp("plugins")
    site = work / "site"
    for name in ("oasr-tinyctc", "oasr-broken"):
        src = work / name
        shutil.copytree(PLUGINS / name, src, ignore=shutil.ignore_patterns("*.egg-info", "build", "__pycache__"))
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        "--no-deps", "--no-build-isolation", "--target", str(site), str(src)],
                       check=True, capture_output=True, text=True, timeout=300)
    assert (site / "oasr_tinyctc" / "plugin.py").is_file()
    return site


def test_third_party_distribution_adds_an_architecture(installed_plugins, tmp_path):
    ckpt = tmp_path / "ckpt"
    result = run_python(textwrap.dedent(f"""
        import json, warnings
        from pathlib import Path
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import oasr
            names = oasr.list_models()
        from oasr_tinyctc.convert import write_checkpoint
        write_checkpoint(Path({str(ckpt)!r}))
        model = oasr.from_pretrained({str(ckpt)!r})
        print(json.dumps({{
            "names": names,
            "model": type(model).__name__,
            "warnings": [str(w.message) for w in caught],
        }}))
    """), pythonpath=[installed_plugins])
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout.strip().splitlines()[-1])
    assert "tinyctc" in data["names"]
    assert data["model"] == "TinyCtcModel"
    broken = [w for w in data["warnings"] if "oasr-broken" in w]
    assert len(broken) == 1 and "refuses to import" in broken[0]


def test_oasr_plugins_lists_distribution_registration_and_error(installed_plugins):
    env_path = [installed_plugins]
    result = run_python("import sys; from oasr.cli import main; sys.exit(main(['plugins']))", pythonpath=env_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    tiny = next(line for line in lines if line.startswith("tinyctc"))
    assert "oasr-tinyctc" in tiny and "0.1.0" in tiny and "model:tinyctc" in tiny
    broken = next(line for line in lines if line.startswith("broken"))
    assert "oasr-broken" in broken and "RuntimeError: oasr-broken refuses to import" in broken
    core = next(line for line in lines if line.startswith("oasr-core"))
    assert "tokenizer:sentencepiece" in core and "decoder:ctc" in core
    strict = run_python("import sys; from oasr.cli import main; sys.exit(main(['plugins', '--strict']))",
                        pythonpath=env_path)
    assert strict.returncode == 1


def test_oasr_plugins_allow_list(installed_plugins):
    code = "import oasr, json; print(json.dumps(oasr.list_models()))"
    only = run_python(code, env={"OASR_PLUGINS": "tinyctc"}, pythonpath=[installed_plugins])
    assert only.returncode == 0, only.stderr
    assert json.loads(only.stdout.splitlines()[-1]) == ["tinyctc"]
    none = run_python(code, env={"OASR_PLUGINS": ""}, pythonpath=[installed_plugins])
    assert json.loads(none.stdout.splitlines()[-1]) == []
    # the broken plugin is not even imported when the allow-list excludes it
    assert "oasr-broken" not in none.stderr


def test_strict_mode_raises_on_a_broken_plugin(installed_plugins):
    result = run_python("import oasr; oasr.list_models()", env={"OASR_STRICT_PLUGINS": "1"},
                        pythonpath=[installed_plugins])
    assert result.returncode != 0
    assert "PluginLoadError" in result.stderr and "oasr-broken" in result.stderr


class _GoodPlugin:
    @hookimpl
    def oasr_register_decoders(self, register):
        register("test_family_decoder", "collections:OrderedDict")


class _HalfBrokenPlugin:
    @hookimpl
    def oasr_register_tokenizers(self, register):
        register("half_broken_tok", "collections:OrderedDict")

    @hookimpl
    def oasr_register_decoders(self, register):
        raise ValueError("boom while registering")


def test_inline_plugins_register_and_a_broken_one_leaves_nothing_behind():
    plugins.register_plugin(_GoodPlugin(), name="good-inline")
    try:
        entry = plugins.registry("decoders").get("test_family_decoder")
        assert entry.distribution == "<runtime>"
        from collections import OrderedDict

        assert entry.load() is OrderedDict
        with pytest.warns(RuntimeWarning, match="boom while registering"):
            record = plugins.register_plugin(_HalfBrokenPlugin(), name="half-broken")
        assert record.error and "boom" in record.error
        assert "half_broken_tok" not in plugins.registry("tokenizers")
        with pytest.raises(UnknownModelError, match="half-broken|boom"):
            plugins.registry("tokenizers").get("half_broken_tok")
    finally:
        plugins.unregister_plugin("good-inline")
        plugins.unregister_plugin("half-broken")
    assert "test_family_decoder" not in plugins.registry("decoders")


def _family(tag: str):
    class Family:
        @hookimpl
        def oasr_register_models(self, register):
            register(f"arch_{tag}", model="collections:OrderedDict", config="collections:OrderedDict")
            register("shared_arch", model="collections:OrderedDict", config="collections:OrderedDict")

        @hookimpl
        def oasr_register_decoders(self, register):
            register("shared_method", f"collections:{'OrderedDict' if tag == 'a' else 'Counter'}")
    return Family()


def test_a_clash_is_settled_per_entry_and_listed_by_oasr_plugins(capsys):
    from collections import Counter, OrderedDict

    from oasr.cli import main

    plugins.register_plugin(_family("a"), name="family-a", distribution="oasr-family-a")
    try:
        with pytest.warns(RuntimeWarning) as caught:
            record = plugins.register_plugin(_family("b"), name="family-b", distribution="oasr-family-b")
        assert record.error is None  # the plugin is not dropped...
        models = plugins.registry("models")
        assert models.get("arch_a").distribution == "oasr-family-a"
        assert models.get("arch_b").distribution == "oasr-family-b"  # ...its own model is registered
        assert models.get("shared_arch").distribution == "oasr-family-a"  # the taken model name is refused alone
        # the strategy is kept in b's namespace, and each family's models resolve their own
        assert plugins.resolve_decoder("shared_method", "oasr-family-a").load() is OrderedDict
        assert plugins.resolve_decoder("shared_method", "oasr-family-b").load() is Counter
        assert plugins.resolve_decoder("shared_method").load() is OrderedDict
        assert len(caught) == 2 and any("shared_arch" in str(w.message) for w in caught)
        assert main(["plugins"]) == 0
        line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("family-b"))
        assert "model:arch_b" in line and "decoder:oasr-family-b:shared_method" in line
        assert "decoder 'shared_method' is taken by 'oasr-family-a'" in line
        assert "model 'shared_arch' refused: already registered by 'oasr-family-a'" in line
    finally:
        plugins.unregister_plugin("family-b")
        plugins.unregister_plugin("family-a")
    assert "arch_b" not in plugins.registry("models") and "shared_arch" not in plugins.registry("models")
    assert "oasr-family-b:shared_method" not in plugins.registry("decoders")


def test_a_core_name_is_never_taken_over():
    class Clash:
        @hookimpl
        def oasr_register_decoders(self, register):
            register("ctc", "collections:OrderedDict")

    with pytest.warns(RuntimeWarning, match="'ctc' is taken by 'oasr-core'"):
        record = plugins.register_plugin(Clash(), name="clash", distribution="oasr-clash")
    try:
        assert record.registered == [("decoders", "oasr-clash:ctc")]
        assert plugins.registry("decoders").get("ctc").distribution == "oasr-core"
    finally:
        plugins.unregister_plugin("clash")


def test_the_alias_label_is_singular(capsys):
    from oasr.cli import main

    class Alias:
        @hookimpl
        def oasr_register_aliases(self, register):
            register("label-test", resolver="collections:OrderedDict")

    plugins.register_plugin(Alias(), name="alias-label")
    try:
        assert main(["plugins"]) == 0
        line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("alias-label"))
        assert "alias:label-test" in line and "aliase" not in line
        with pytest.raises(UnknownModelError, match="^alias 'nope' is not registered"):
            plugins.registry("aliases").get("nope")
    finally:
        plugins.unregister_plugin("alias-label")


def test_strict_inline_registration_raises(monkeypatch):
    monkeypatch.setenv("OASR_STRICT_PLUGINS", "1")
    with pytest.raises(PluginLoadError, match="boom while registering"):
        plugins.register_plugin(_HalfBrokenPlugin(), name="half-broken-strict")
    plugins.unregister_plugin("half-broken-strict")
