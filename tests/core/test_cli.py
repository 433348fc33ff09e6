"""The ``oasr`` command line: models, plugins, convert, errors."""

from __future__ import annotations

import json

from oasr.cli import main
from tests.helpers import ensure_tinyctc_importable, tinyctc_registered

ensure_tinyctc_importable()


def test_models_lists_registered_architectures(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "conformer" in out and "oasr-models-wenet" in out


def test_convert_writes_a_native_bundle(tmp_path, capsys):
    from oasr_tinyctc.convert import write_checkpoint

    with tinyctc_registered():
        src = write_checkpoint(tmp_path / "src")
        assert main(["convert", str(src), str(tmp_path / "bundle")]) == 0
        assert "wrote native bundle" in capsys.readouterr().out
        config = json.loads((tmp_path / "bundle" / "oasr_config.json").read_text())
        assert config["format_version"] == 1 and config["architecture"] == "tinyctc"
        # a second conversion into the same non-empty directory is refused unless forced
        assert main(["convert", str(src), str(tmp_path / "bundle")]) == 2
        assert "exists and is not empty" in capsys.readouterr().err
        assert main(["convert", str(src), str(tmp_path / "bundle"), "--force"]) == 0


def test_an_unrecognized_checkpoint_is_one_clear_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["convert", str(tmp_path / "empty"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("oasr: error: no converter recognizes") and "Traceback" not in err


def test_convert_int8_writes_a_format_2_bundle_that_loads(tmp_path):
    import torch

    from oasr.checkpoints import load_pretrained
    from oasr_tinyctc.convert import write_checkpoint

    with tinyctc_registered():
        src = write_checkpoint(tmp_path / "src", seed=2)
        assert main(["convert", str(src), str(tmp_path / "q"), "--quantization", "int8"]) == 0
        config = json.loads((tmp_path / "q" / "oasr_config.json").read_text())
        assert config["format_version"] == 2 and "ctc" in config["quantization"]["layers"]
        fp32 = load_pretrained(src).model
        int8 = load_pretrained(tmp_path / "q").model
        feats = torch.randn(1, 40, 80, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            a, _ = fp32.forward_offline(feats, torch.tensor([40]))
            b, _ = int8.forward_offline(feats, torch.tensor([40]))
        assert not torch.equal(a, b)  # the weights really are int8
        assert (a.exp() - b.exp()).abs().max() < 0.05  # and still close to fp32


def _defaults(command: str) -> dict[str, object]:
    import argparse
    import importlib

    from oasr.cli import COMMANDS

    parser = argparse.ArgumentParser()
    importlib.import_module(COMMANDS[command][0]).add_arguments(parser)
    defaults: dict[str, object] = {}
    for action in parser._actions:  # the first flag of a dest (hidden spelling aliases come later)
        defaults.setdefault(action.dest, action.default)
    return defaults


def test_engine_flags_of_transcribe_and_serve_are_the_engine_config_fields():
    import attrs

    from oasr import transcribe_cli
    from oasr.engine import EngineConfig
    from oasr.serve import options as serve_cli

    fields = attrs.fields_dict(EngineConfig)
    transcribe, serve = _defaults("transcribe"), _defaults("serve")
    for defaults, names in ((transcribe, transcribe_cli.ENGINE_FIELDS),
                            (serve, (*serve_cli.ENGINE_FIELDS, *serve_cli.BATCHING_FIELDS, *serve_cli.STREAMING_FIELDS,
                                     *serve_cli.SERVER_ENGINE_FIELDS))):
        assert {n: defaults[n] for n in names} == {n: fields[n].default for n in names}
    shared = set(transcribe_cli.ENGINE_FIELDS) & set(serve)
    assert {"max_batch_size", "num_threads", "decode_method", "dtype", "quantization"} <= shared
    assert transcribe["max_batch_size"] == serve["max_batch_size"] == EngineConfig().max_batch_size


def test_an_engine_flag_keeps_the_field_choices_and_type(capsys):
    import argparse

    import pytest

    from oasr import transcribe_cli

    parser = argparse.ArgumentParser()
    transcribe_cli.add_arguments(parser)
    args = parser.parse_args(["a.wav", "--batch-size", "3", "--threads", "2"])
    assert (args.max_batch_size, args.num_threads) == (3, 2)
    with pytest.raises(SystemExit):
        parser.parse_args(["a.wav", "--quantization", "int4"])
    assert "argument --quantization: invalid choice: 'int4'" in capsys.readouterr().err


def test_engine_config_validators_raise_config_error_naming_the_field():
    import pytest

    from oasr.engine import EngineConfig
    from oasr.errors import ConfigError

    with pytest.raises(ConfigError, match="EngineConfig.max_batch_size: 'max_batch_size' must be >= 1: 0") as err:
        EngineConfig(max_batch_size=0)
    assert err.value.key == "max_batch_size"
    with pytest.raises(ConfigError, match="EngineConfig.schedule_policy: .*'fcfs', 'bucket', 'sjf'"):
        EngineConfig(schedule_policy="random")
    with pytest.raises(ConfigError, match="EngineConfig.max_queue: must be positive or None, got -1"):
        EngineConfig(max_queue=-1)


def test_a_missing_serve_extra_is_one_line_naming_it(monkeypatch, capsys):
    """``oasr serve`` without the [serve] extra: the extra to install, in one line, no traceback."""
    import sys

    for name in ("uvicorn", "fastapi"):  # an import of these now fails as if they were absent
        monkeypatch.setitem(sys.modules, name, None)
    for name in [m for m in sys.modules if m.startswith("oasr.serve.") and m != "oasr.serve.cli"]:
        monkeypatch.delitem(sys.modules, name)  # as in a fresh process: the server modules not yet imported
    assert main(["serve", "--model", "no-such-dir-but-never-loaded"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("oasr: error: this command needs ")
    assert lines[0].endswith('which is not installed: pip install "oasr-core[serve]" '
                             '(in a checkout: pip install -e "./oasr-core[serve]")')


def test_a_missing_family_is_named_with_its_extra():
    from oasr.cli import missing_extra_message

    exc = ModuleNotFoundError("No module named 'oasr_models_hf'", name="oasr_models_hf")
    assert 'pip install "oasr-core[hf]"' in missing_extra_message(exc)
    assert missing_extra_message(ModuleNotFoundError("x", name="not_optional")) is None


def _fake_hub_cache(root, hub_id: str, files: dict[str, str]):
    """huggingface_hub's cache layout for one snapshot (what a download leaves behind)."""
    repo = root / f"models--{hub_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    for name, text in files.items():
        (snapshot / name).write_text(text)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    return snapshot


def test_whisper_names_resolve_through_the_hub_cache(tmp_path, capsys, monkeypatch):
    """`oasr download base --model-dir DIR` offline: the cached snapshot of openai/whisper-base; a name
    that is not cached is one line saying how to fetch it."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setattr(hc, "HF_HUB_CACHE", hc.HF_HUB_CACHE)  # restored after set_model_dir changes it
    snapshot = _fake_hub_cache(tmp_path, "openai/whisper-base", {"config.json": "{}"})
    assert main(["download", "base", "--model-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == str(snapshot.resolve())
    assert main(["download", "turbo", "--model-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "openai/whisper-large-v3-turbo" in err and "oasr download turbo" in err
    assert len(err.strip().splitlines()) == 1


def test_openai_whisper_model_names_are_listed(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    aliases = {line.split()[0] for line in out.splitlines() if "oasr-models-hf" in line}
    assert {"tiny.en", "tiny", "base", "small", "medium", "large-v3", "turbo"} <= aliases
