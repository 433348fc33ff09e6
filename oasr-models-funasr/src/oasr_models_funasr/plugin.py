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


@hookimpl
def oasr_register_decoders(register) -> None:
    register("paraformer", "oasr_models_funasr.decode:ParaformerDecodeStrategy")
