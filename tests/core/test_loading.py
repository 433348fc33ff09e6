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
from oasr.checkpoints import (
    DETECT_ASSET_LAYOUT,
    DETECT_KEYED_VALUE,
    DETECT_NAMED_CONFIG,
    load_pretrained,
    load_torch_checkpoint,
)
from oasr.checkpoints.native import load_native, read_native_config, save_native
from oasr.errors import AmbiguousCheckpointError, CheckpointFormatError, UnknownModelError
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
        from oasr.models import register_model
        from oasr.checkpoints import load_pretrained
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
    with pytest.raises(CheckpointFormatError, match="leads outside the model directory"):
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


# -- hub cache snapshots, links out of the model, corrupt files ----------------------------------------------
def _tiny_hf_whisper(root: Path) -> Path:
    from transformers import WhisperTokenizerFast

    from tests.models.hf.whisper import _helpers as h

    tokenizer_dir = root / "tok"
    WhisperTokenizerFast(tokenizer_object=h.whisper_tokenizer(multilingual=True), bos_token="<|endoftext|>",
                         eos_token="<|endoftext|>", unk_token="<|endoftext|>",
                         pad_token="<|endoftext|>").save_pretrained(tokenizer_dir)
    return h.build_tiny_hf(root / "plain", tokenizer_dir, seed=3)


def _shard(model_dir: Path, parts: int = 3) -> None:
    """Split model.safetensors into ``parts`` shards with an index, as a sharded hub upload has."""
    from safetensors.torch import load_file, save_file

    state = load_file(str(model_dir / "model.safetensors"))
    names = sorted(state)
    weight_map = {}
    for i in range(parts):
        shard = f"model-{i + 1:05d}-of-{parts:05d}.safetensors"
        keys = names[i::parts]
        save_file({k: state[k] for k in keys}, str(model_dir / shard), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(keys, shard))
    (model_dir / "model.safetensors").unlink()
    (model_dir / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def _hub_cache(cache: Path, repo: str, files: Path, revision: str = "0123456789abcdef") -> Path:
    """``files`` laid out as huggingface_hub caches a download: blobs/<hash> + snapshots/<rev>/name → blob."""
    import hashlib

    folder = cache / ("models--" + repo.replace("/", "--"))
    snapshot = folder / "snapshots" / revision
    (folder / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(revision)
    for file in sorted(files.iterdir()):
        data = file.read_bytes()
        blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / file.name).symlink_to(Path("..") / ".." / "blobs" / blob.name)
    return snapshot


@pytest.fixture(scope="module")
def sharded_whisper(tmp_path_factory) -> Path:
    plain = _tiny_hf_whisper(tmp_path_factory.mktemp("whisper"))
    _shard(plain)
    return plain


def test_sharded_safetensors_in_a_hub_cache_snapshot_load(sharded_whisper, tmp_path, monkeypatch):
    """snapshots/<rev>/model-0000N-of-00003.safetensors → ../../blobs/<hash>: the layout of every sharded
    hub download loads, by path and by hub id from the offline cache, with the plain copy's weights."""
    snapshot = _hub_cache(tmp_path / "hub", "org/tiny-whisper", sharded_whisper)
    assert (snapshot / "model-00001-of-00003.safetensors").is_symlink()
    plain = load_pretrained(sharded_whisper).model.state_dict()
    by_path = load_pretrained(snapshot).model.state_dict()
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    by_id = load_pretrained("org/tiny-whisper").model.state_dict()
    assert plain.keys() == by_path.keys() == by_id.keys()
    assert all(torch.equal(plain[k], by_path[k]) and torch.equal(plain[k], by_id[k]) for k in plain)


@pytest.mark.parametrize("target", ["outside", "other repo"])
def test_a_link_out_of_the_models_repo_is_refused_and_never_echoed(sharded_whisper, tmp_path, target):
    snapshot = _hub_cache(tmp_path / "hub", "org/tiny-whisper", sharded_whisper)
    if target == "outside":
        secret = tmp_path / "private" / "secret-name.txt"
        secret.parent.mkdir()
        secret.write_text("SECRET-FIRST-LINE 1\n")
    else:
        other = _hub_cache(tmp_path / "hub", "org/other", sharded_whisper, revision="fedcba")
        secret = (other / "config.json").resolve()
    (snapshot / "tokenizer.json").unlink()
    (snapshot / "tokenizer.json").symlink_to(secret)
    with pytest.raises(CheckpointFormatError, match="leads outside the model directory") as err:
        load_pretrained(snapshot)
    message = str(err.value)
    assert "tokenizer.json" in message
    assert str(secret) not in message and secret.name not in message and "SECRET" not in message


def test_a_units_file_linked_to_a_system_file_is_not_followed(tmp_path):
    """The WeNet fixture with units.txt → a file outside the model: refused before it is read."""
    import shutil

    from tests.helpers import REPO

    model = tmp_path / "wenet"
    shutil.copytree(REPO.parent / "shared" / "fixtures" / "wenet_u2pp" / "model", model)
    outside = tmp_path / "passwd"
    outside.write_text("root:x:0:0:root:/root:/bin/bash\n")
    (model / "units.txt").unlink()
    (model / "units.txt").symlink_to(outside)
    with pytest.raises(CheckpointFormatError, match="units.txt: this path leads outside") as err:
        load_pretrained(model)
    assert "root:x" not in str(err.value) and str(outside) not in str(err.value)


def test_a_corrupt_safetensors_header_names_the_file(sharded_whisper, tmp_path):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(sharded_whisper, model)
    shard = model / "model-00002-of-00003.safetensors"
    shard.write_bytes(b"\xff" * 8 + b"not a header" + shard.read_bytes()[20:])
    with pytest.raises(CheckpointFormatError, match=r"model-00002-of-00003.safetensors is not a readable safetensors"):
        load_pretrained(model)


def test_random_bytes_in_a_pt_file_are_called_corrupt_not_unsafe(tmp_path):
    path = tmp_path / "final.pt"
    path.write_bytes(bytes(range(256)) * 16)
    with pytest.raises(CheckpointFormatError, match="is not a PyTorch checkpoint") as err:
        load_torch_checkpoint(path)
    assert "unpickling" not in str(err.value)


def _ct2_bytes(shape: tuple[int, ...], values: int) -> bytes:
    """A minimal CTranslate2 model.bin (binary version 6) holding one float32 variable."""
    import struct

    def string(text: str) -> bytes:
        raw = text.encode() + b"\0"
        return struct.pack("<H", len(raw)) + raw

    var = string("encoder/conv1/weight") + struct.pack("<B", len(shape)) + b"".join(struct.pack("<I", d) for d in shape)
    var += struct.pack("<BI", 0, 4 * values) + b"\0" * (4 * values)
    return struct.pack("<I", 6) + string("WhisperSpec") + struct.pack("<II", 3, 1) + var + struct.pack("<I", 0)


def test_a_ct2_variable_whose_shape_disagrees_with_its_bytes_is_a_format_error(tmp_path):
    from oasr_models_hf.whisper.convert import read_ct2_model

    good = tmp_path / "good.bin"
    good.write_bytes(_ct2_bytes((2, 3), 6))
    assert read_ct2_model(good)[2]["encoder/conv1/weight"].shape == (2, 3)
    bad = tmp_path / "model.bin"
    bad.write_bytes(_ct2_bytes((2, 3), 5))
    with pytest.raises(CheckpointFormatError, match=r"model.bin: variable 'encoder/conv1/weight' has shape \(2, 3\)"):
        read_ct2_model(bad)


def test_the_cli_reports_a_corrupt_checkpoint_as_oasr_error_exit_2(sharded_whisper, tmp_path):
    import shutil
    import subprocess
    import sys

    import numpy as np
    import soundfile as sf

    model = tmp_path / "model"
    shutil.copytree(sharded_whisper, model)
    (model / "model-00001-of-00003.safetensors").write_bytes(b"\x00" * 100)
    wav = tmp_path / "a.wav"
    sf.write(wav, np.zeros(16000, np.float32), 16000)
    done = subprocess.run([sys.executable, "-m", "oasr.cli", "transcribe", "--model", str(model), str(wav)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("oasr: error:") and "Traceback" not in done.stderr, done.stderr
    assert "model-00001-of-00003.safetensors" in done.stderr
