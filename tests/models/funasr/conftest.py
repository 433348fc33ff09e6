"""Fixtures of the FunASR family tests: tiny random models built by FunASR's own registry, saved as
ModelScope-style folders, with FunASR's ``AutoModel`` over each as the reference."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.models.funasr import _build as b
from tests.models.funasr import _helpers as h

#: (model class, shape) of every reference folder
VARIANTS = [("Paraformer", "small"), ("Paraformer", "deep"), ("BiCifParaformer", "small"),
            ("BiCifParaformer", "deep")]


@pytest.fixture(scope="session")
def funasr_root(tmp_path_factory) -> Path:
    try:
        import funasr  # noqa: F401
    except ImportError:
        pytest.fail('funasr is not installed: pip install "funasr[knf]==1.4.16" (requirements/test.txt)')
    logging.getLogger("funasr").setLevel(logging.WARNING)
    return tmp_path_factory.mktemp("funasr")


@pytest.fixture(scope="session")
def model_dirs(funasr_root) -> dict[tuple[str, str], Path]:
    out = {}
    for seed, (model, shape) in enumerate(VARIANTS):
        conf = b.paraformer_conf(b.SHAPES[shape], len(b.TOKENS), model)
        out[(model, shape)] = b.build_funasr_dir(funasr_root / f"{model}-{shape}", conf, seed=seed)
    return out


@pytest.fixture(scope="session")
def references(model_dirs):
    return {key: h.reference(path) for key, path in model_dirs.items()}


@pytest.fixture(scope="session")
def clips(tmp_path_factory) -> list[tuple[str, object]]:
    """(name, float32 16 kHz audio): the espeak-ng sentences and the repository sample."""
    out = tmp_path_factory.mktemp("espeak")
    speech = [(f"espeak{i}", h.espeak(text, out / f"s{i}.wav")) for i, text in enumerate(h.SENTENCES)]
    return speech + [("sample", h.read_wav(h.SAMPLE))]


@pytest.fixture(scope="session")
def sensevoice_dirs(funasr_root) -> dict[str, Path]:
    return {shape: b.build_sensevoice_dir(funasr_root / f"SenseVoiceSmall-{shape}", dims, seed=10 + i)
            for i, (shape, dims) in enumerate(b.SENSEVOICE_SHAPES.items())}


@pytest.fixture(scope="session")
def sensevoice_refs(sensevoice_dirs):
    return {shape: h.reference(path) for shape, path in sensevoice_dirs.items()}
