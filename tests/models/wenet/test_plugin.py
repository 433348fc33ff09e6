"""oasr-models-wenet registers through its entry point by string, importing no torch or model code."""

from __future__ import annotations

import oasr
from oasr.models.registry import model_infos
from tests.helpers import run_python


def test_conformer_is_registered_by_the_wenet_distribution():
    assert "conformer" in oasr.list_models()
    info = next(i for i in model_infos() if i.name == "conformer")
    assert info.distribution == "oasr-models-wenet"
    assert (info.model, info.config, info.converter) == (
        "oasr_models_wenet.model:ConformerModel", "oasr_models_wenet.config:ConformerModelConfig",
        "oasr_models_wenet.convert:WenetConverter")


def test_the_plugin_module_imports_no_torch_and_listing_imports_no_model_code():
    code = (
        "import sys\n"
        "import oasr_models_wenet.plugin\n"
        "assert 'torch' not in sys.modules, 'importing the plugin imported torch'\n"
        "import oasr\n"
        "from oasr import plugins\n"
        "assert 'conformer' in oasr.list_models()\n"
        "assert 'ctc_aed_rescoring' in plugins.registry('decoders').names()\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('oasr_models_wenet.'))\n"
        "assert loaded == ['oasr_models_wenet.plugin'], loaded\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
