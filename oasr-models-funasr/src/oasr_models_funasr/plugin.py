"""Hook implementations of oasr-models-funasr (registers by string; imports no torch or model code)."""

from __future__ import annotations

from oasr.hookspecs import hookimpl


@hookimpl
def oasr_register_models(register) -> None:
    register(
        "paraformer",
        model="oasr_models_funasr.model:ParaformerModel",
        config="oasr_models_funasr.config:ParaformerConfig",
        converter="oasr_models_funasr.convert:FunASRParaformerConverter",
        description="FunASR Paraformer / BiCifParaformer: SANM encoder, CIF predictor, NAR decoder, CIF timestamps",
    )
    register(
        "sensevoice",
        model="oasr_models_funasr.sensevoice:SenseVoiceModel",
        config="oasr_models_funasr.config:SenseVoiceConfig",
        converter="oasr_models_funasr.convert:FunASRSenseVoiceConverter",
        description="FunASR SenseVoice-Small: SANM encoder + CTC with language, emotion and event tags",
    )


@hookimpl
def oasr_register_decoders(register) -> None:
    register("paraformer", "oasr_models_funasr.decode:ParaformerDecodeStrategy")
    register("sensevoice", "oasr_models_funasr.decode:SenseVoiceDecodeStrategy")
