"""Checkpoint resolution precedence, weight-load accounting, safe loading and the native bundle."""

from __future__ import annotations

import contextlib
import json
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import oasr
from oasr.checkpoints.native import load_native, read_native_config, save_native
from oasr.errors import AmbiguousCheckpointError, CheckpointFormatError, UnknownModelError
from oasr.models import (
    DETECT_ASSET_LAYOUT,
    DETECT_KEYED_VALUE,
    DETECT_NAMED_CONFIG,
    load_pretrained,
    load_torch_checkpoint,
)
from tests.helpers import TINYCTC_SRC, ensure_tinyctc_importable, registered_model, run_python, tinyctc_registered

ensure_tinyctc_importable()

from oasr_tinyctc.convert import TinyCtcConverter, write_checkpoint  # noqa: E402
from oasr_tinyctc.model import TinyCtcModel  # noqa: E402

MODEL = "oasr_tinyctc.model:TinyCtcModel"
CONFIG = "oasr_tinyctc.model:TinyCtcConfig"


def _marker_converter(marker: str, level: int, arch: str):
    class Marker(TinyCtcConverter):
        architecture = arch
        detect_specificity = level

        def detect(self, path: Path) -> bool:
            return (path / marker).exists()

    Marker.__name__ = f"Marker_{arch}"
    return Marker


@pytest.fixture
def archs():
    """Three test architectures claiming directories by marker files at levels 30/20/10."""
    names = {"t_keyed": ("keyed.marker", DETECT_KEYED_VALUE), "t_named": ("named.marker", DETECT_NAMED_CONFIG),
             "t_asset": ("asset.marker", DETECT_ASSET_LAYOUT), "t_keyed2": ("keyed2.marker", DETECT_KEYED_VALUE)}
    with contextlib.ExitStack() as stack:
        stack.enter_context(tinyctc_registered(TinyCtcConverter))
        for name, (marker, level) in names.items():
            stack.enter_context(registered_model(name, MODEL, CONFIG, _marker_converter(marker, level, name)))
        yield names


def _ckpt(tmp_path: Path, *markers: str) -> Path:
    path = write_checkpoint(tmp_path / "ckpt")
    (path / "tinyctc.json").rename(path / "tinyctc.cfg")  # only marker files claim this directory
    for marker in markers:
        (path / marker).touch()
    return path


@pytest.fixture(autouse=True)
def _tinyctc_json_alias(monkeypatch):
    """Marker converters read the config from tinyctc.cfg when tinyctc.json was renamed."""
    original = TinyCtcConverter.build_config

    def build_config(self, path, state_dict):
        if not (path / "tinyctc.json").exists() and (path / "tinyctc.cfg").exists():
            raw = json.loads((path / "tinyctc.cfg").read_text())
            raw.pop("model_type")
            from oasr import serde
            from oasr_tinyctc.model import TinyCtcConfig

            return serde.structure(raw, TinyCtcConfig)
        return original(self, path, state_dict)

    monkeypatch.setattr(TinyCtcConverter, "build_config", build_config)


def _arch_of(path: Path, **kw) -> str:
    return load_pretrained(path, **kw).architecture


def test_specificity_ranking(archs, tmp_path):
    assert _arch_of(_ckpt(tmp_path / "a", "keyed.marker", "named.marker", "asset.marker")) == "t_keyed"
    assert _arch_of(_ckpt(tmp_path / "b", "named.marker", "asset.marker")) == "t_named"
    assert _arch_of(_ckpt(tmp_path / "c", "asset.marker")) == "t_asset"


def test_a_tie_at_the_top_raises_naming_both(archs, tmp_path):
    path = _ckpt(tmp_path, "keyed.marker", "keyed2.marker", "asset.marker")
    with pytest.raises(AmbiguousCheckpointError) as info:
        load_pretrained(path)
    assert info.value.candidates == ("t_keyed", "t_keyed2")
    assert "t_keyed, t_keyed2" in str(info.value) and "architecture=" in str(info.value)


def test_no_claim_raises_saying_what_was_looked_for(archs, tmp_path):
    path = _ckpt(tmp_path)
    with pytest.raises(CheckpointFormatError, match="no converter recognizes .*oasr_config.json"):
        load_pretrained(path)


def test_explicit_architecture_beats_detection(archs, tmp_path):
    path = _ckpt(tmp_path, "keyed.marker")
    assert _arch_of(path) == "t_keyed"
    assert _arch_of(path, architecture="t_asset") == "t_asset"
    with pytest.raises(UnknownModelError, match="not registered; registered: .*t_asset"):
        load_pretrained(path, architecture="nope")


def test_native_beats_explicit_and_detection(archs, tmp_path):
    src = write_checkpoint(tmp_path / "src")
    loaded = load_pretrained(src)
    assert loaded.architecture == "tinyctc"
    bundle = save_native(loaded, tmp_path / "bundle")
    (bundle / "keyed.marker").touch()  # a converter would claim it too
    assert _arch_of(bundle) == "tinyctc"
    with pytest.raises(UnknownModelError, match="native bundle of architecture 'tinyctc', not 't_asset'"):
        load_pretrained(bundle, architecture="t_asset")


def _feats(seed=0, batch=3, frames=37, dim=80):
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(batch, frames, dim, generator=g)
    lens = torch.tensor([frames, frames - 5, frames - 11][:batch])
    return feats, lens


def test_native_round_trip_is_bit_identical(archs, tmp_path):
    src = write_checkpoint(tmp_path / "src", seed=3)
    source = load_pretrained(src)
    from oasr.checkpoints.convert import convert

    bundle = convert(str(src), tmp_path / "bundle")
    cfg = read_native_config(bundle)
    assert cfg.format_version == 1 and cfg.architecture == "tinyctc"
    assert (bundle / "tokenizer" / "units.txt").read_text() == (src / "units.txt").read_text()
    assert cfg.tokenizer.files == {"units": "units.txt"}
    native = load_native(bundle)
    feats, lens = _feats()
    with torch.no_grad():
        a, la = source.model.forward_offline(feats, lens)
        b, lb = native.model.forward_offline(feats, lens)
    assert torch.equal(a, b) and torch.equal(la, lb)
    assert native.feature_spec == source.feature_spec
    assert native.decoding_defaults == source.decoding_defaults


def test_native_bundle_loads_with_other_families_uninstalled(tmp_path):
    """Block every family distribution and reference framework except the owner's module."""
    src = write_checkpoint(tmp_path / "src", seed=5)
    result = run_python(textwrap.dedent(f"""
        import sys, importlib.abc
        sys.path.insert(0, {str(TINYCTC_SRC)!r})
        from oasr.checkpoints.convert import convert
        from oasr.models import register_model
        register_model("tinyctc", "oasr_tinyctc.model:TinyCtcModel", "oasr_tinyctc.model:TinyCtcConfig",
                       "oasr_tinyctc.convert:TinyCtcConverter")
        convert({str(src)!r}, {str(tmp_path / "bundle")!r})
    """))
    assert result.returncode == 0, result.stderr
    result = run_python(textwrap.dedent(f"""
        import sys, warnings
        BLOCKED = ("oasr_models_", "oasr_kernels", "transformers", "funasr", "ctranslate2", "faster_whisper",
                   "whisper", "wenet", "icefall", "k2", "lhotse", "oasr_tinyctc.convert")
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.startswith(BLOCKED):
                    raise ImportError(f"{{name}} is uninstalled for this test")
        sys.meta_path.insert(0, Block())
        sys.path.insert(0, {str(TINYCTC_SRC)!r})
        warnings.simplefilter("ignore")
        import torch
        from oasr.models import register_model, load_pretrained
        register_model("tinyctc", "oasr_tinyctc.model:TinyCtcModel", "oasr_tinyctc.model:TinyCtcConfig")
        loaded = load_pretrained({str(tmp_path / "bundle")!r})
        g = torch.Generator().manual_seed(0)
        feats = torch.randn(2, 30, 80, generator=g)
        out, _ = loaded.model.forward_offline(feats, torch.tensor([30, 21]))
        torch.save(out, {str(tmp_path / "native_out.pt")!r})
        print(sorted(m for m in sys.modules if m.startswith(("oasr_models_", "transformers", "oasr_tinyctc"))))
    """))
    assert result.returncode == 0, result.stderr
    assert "oasr_tinyctc.convert" not in result.stdout and "transformers" not in result.stdout
    with tinyctc_registered(TinyCtcConverter):
        model = load_pretrained(src).model
        feats = torch.randn(2, 30, 80, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            expected, _ = model.forward_offline(feats, torch.tensor([30, 21]))
    assert torch.equal(torch.load(tmp_path / "native_out.pt"), expected)


def test_native_bundle_refuses_newer_format_and_path_escape(archs, tmp_path):
    bundle = save_native(load_pretrained(write_checkpoint(tmp_path / "src")), tmp_path / "bundle")
    cfg_path = bundle / "oasr_config.json"
    raw = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps({**raw, "format_version": 99}))
    with pytest.raises(CheckpointFormatError, match="format_version 99; this OASR reads up to 2"):
        load_native(bundle)
    cfg_path.write_text(json.dumps({**raw, "tokenizer": {**raw["tokenizer"], "files": {"units": "../../etc/passwd"}}}))
    with pytest.raises(CheckpointFormatError, match="outside the bundle"):
        load_native(bundle)
    cfg_path.write_text(json.dumps({**raw, "surprise": 1}))
    with pytest.raises(CheckpointFormatError, match="unknown key.*surprise"):
        load_native(bundle)


def test_native_bundle_is_strict_about_tensors(archs, tmp_path):
    from safetensors.torch import load_file, save_file

    bundle = save_native(load_pretrained(write_checkpoint(tmp_path / "src")), tmp_path / "bundle")
    state = load_file(str(bundle / "model.safetensors"))
    state.pop("ctc.bias")
    state["extra.weight"] = torch.zeros(1)
    save_file(state, str(bundle / "model.safetensors"))
    with pytest.raises(CheckpointFormatError, match=r"missing \['ctc.bias'\], unexpected \['extra.weight'\]"):
        load_native(bundle)


class _Evil:
    def __reduce__(self):
        return (print, ("pwned",))


def test_a_pickle_that_is_not_plain_tensors_is_refused(tmp_path, capsys):
    path = tmp_path / "evil.pt"
    torch.save({"model": {"w": torch.zeros(2)}, "extra": _Evil()}, path)
    with pytest.raises(CheckpointFormatError, match="arbitrary unpickling"):
        load_torch_checkpoint(path)
    assert "pwned" not in capsys.readouterr().out
    plain = tmp_path / "plain.pt"
    torch.save({"model": {"w": torch.ones(2)}, "epoch": 3}, plain)
    assert torch.equal(load_torch_checkpoint(plain)["model"]["w"], torch.ones(2))


def test_pickle_refusal_through_a_converter(archs, tmp_path):
    path = write_checkpoint(tmp_path / "ckpt")
    torch.save({"model": TinyCtcModel.__init__}, path / "model.pt")
    with pytest.raises(CheckpointFormatError, match="refusing to load"):
        load_pretrained(path)


# -- weight-load accounting ------------------------------------------------------------------------


class _HintedConverter(TinyCtcConverter):
    expected_unused_prefixes = ("training_head.",)
    capability_drop_hints = {"decoder.": "the attention decoder is lost, so ctc_aed_rescoring is unavailable"}


@pytest.fixture
def hinted():
    with tinyctc_registered(_HintedConverter):
        yield


def _save_state(path: Path, state: dict) -> None:
    torch.save(state, path / "model.pt")


def test_expected_unused_is_silent_and_hints_warn_by_name(hinted, tmp_path):
    path = write_checkpoint(tmp_path / "ckpt")
    state = torch.load(path / "model.pt")
    state["training_head.weight"] = torch.zeros(3)
    _save_state(path, state)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_pretrained(path)
    state["decoder.layer.weight"] = torch.zeros(3)
    _save_state(path, state)
    with pytest.warns(RuntimeWarning, match="'decoder.'.*ctc_aed_rescoring is unavailable"):
        load_pretrained(path)
    state["mystery.weight"] = torch.zeros(3)
    _save_state(path, state)
    with pytest.warns(RuntimeWarning) as caught:
        load_pretrained(path)
    messages = [str(w.message) for w in caught]
    assert any("1 checkpoint tensor(s) were not used by the model: mystery.weight" in m for m in messages)
    assert any("ctc_aed_rescoring is unavailable" in m for m in messages)


def test_an_unfilled_model_tensor_is_a_load_error_with_the_hints(hinted, tmp_path):
    path = write_checkpoint(tmp_path / "ckpt")
    state = torch.load(path / "model.pt")
    del state["ctc.weight"]
    state["decoder.layer.weight"] = torch.zeros(3)
    _save_state(path, state)
    with pytest.raises(CheckpointFormatError) as info, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        load_pretrained(path)
    assert "1 model tensor(s) were not filled" in str(info.value) and "ctc.weight" in str(info.value)
    assert "ctc_aed_rescoring is unavailable" in str(info.value)


def test_a_shape_mismatch_names_the_tensor(hinted, tmp_path):
    path = write_checkpoint(tmp_path / "ckpt")
    state = torch.load(path / "model.pt")
    state["ctc.weight"] = torch.zeros(5, 5)
    _save_state(path, state)
    with pytest.raises(CheckpointFormatError, match=r"'ctc.weight' has shape \(5, 5\), the model expects \(16, 32\)"):
        load_pretrained(path)


def test_dtype_is_cast_on_the_host(archs, tmp_path):
    model = oasr.from_pretrained(write_checkpoint(tmp_path / "ckpt"), dtype="float64")
    assert model.compute_dtype == torch.float64
    assert not model.training


def test_unknown_source_and_bad_hub_id(tmp_path):
    with pytest.raises(CheckpointFormatError, match="neither an existing directory"):
        load_pretrained("not a valid//hub id")
    with pytest.raises(CheckpointFormatError, match="is a file"):
        f = tmp_path / "x.bin"
        f.write_bytes(b"0")
        load_pretrained(f)
