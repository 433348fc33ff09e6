"""A third-party family with its own decode family and a slot streaming encoder, installed from its
own pyproject.toml, runs offline and streaming with no core file naming it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests.engine.conftest import synth
from tests.engine.test_backends import SECONDS
from tests.helpers import PLUGINS, REPO, run_python

NAMES = re.compile(r"toyframe|toyfamily|framewise", re.IGNORECASE)


@pytest.fixture(scope="module")
def installed_family(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("family")
    src = work / "oasr-toyfamily"
    shutil.copytree(PLUGINS / "oasr-toyfamily", src, ignore=shutil.ignore_patterns("*.egg-info", "build", "__pycache__"))
    site = work / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                    "--no-build-isolation", "--target", str(site), str(src)],
                   check=True, capture_output=True, text=True, timeout=300)
    assert (site / "oasr_toyfamily" / "plugin.py").is_file()
    return site


def test_no_core_file_names_the_family():
    core = REPO / "oasr-core"
    offenders = [str(p.relative_to(core)) for p in core.rglob("*")
                 if p.is_file() and "__pycache__" not in p.parts and ".egg-info" not in str(p)
                 and NAMES.search(p.read_text(errors="ignore"))]
    assert offenders == []


def test_the_installed_family_decodes_offline_and_streaming(installed_family, tmp_path):
    # the checkpoint and clip of tests/engine/test_backends.py, whose margins that module guards
    np.save(tmp_path / "audio.npy", synth(SECONDS[5], seed=205))
    result = run_python(textwrap.dedent(f"""
        import json
        from pathlib import Path
        import numpy as np
        from oasr import plugins
        from oasr.engine import DecodingOptions, Engine, EngineConfig
        from oasr_toyfamily.convert import write_checkpoint

        ckpt = str(write_checkpoint(Path({str(tmp_path / "ckpt")!r}), seed=3))
        audio = np.load({str(tmp_path / "audio.npy")!r})
        offline = Engine(EngineConfig(model=ckpt))
        streaming = Engine(EngineConfig(model=ckpt, service_mode="streaming", chunk_size=4))
        fr = DecodingOptions(language="fr")
        record = next(r for r in plugins.plugin_records() if r.distribution == "oasr-toyfamily")
        print(json.dumps({{
            "registered": record.registered, "error": record.error,
            "method": offline.decode_method, "kind": streaming._streaming.kind,
            "offline": offline.transcribe_outputs(audio, sample_rate=16000).tokens,
            "streaming": streaming.transcribe_outputs(audio, sample_rate=16000, streaming=True).tokens,
            "offline_fr": offline.transcribe_outputs(audio, sample_rate=16000, decoding=fr).tokens,
            "streaming_fr": streaming.transcribe_outputs(audio, sample_rate=16000, streaming=True,
                                                         decoding=fr).tokens,
        }}))
    """), pythonpath=[installed_family])
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout.strip().splitlines()[-1])
    assert data["error"] is None
    assert sorted(map(tuple, data["registered"])) == [("decoders", "framewise"), ("models", "toyframe")]
    assert (data["method"], data["kind"]) == ("framewise", "slot")
    assert len(data["offline"]) >= 5 and data["streaming"] == data["offline"]
    assert data["streaming_fr"] == data["offline_fr"] != data["offline"]
