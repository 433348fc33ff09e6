"""Hook implementations of oasr-models-wenet: registers by string, imports no torch or model code."""

from __future__ import annotations

from oasr.hookspecs import hookimpl


@hookimpl
def oasr_register_models(register) -> None:
    register(
        "conformer",
        model="oasr_models_wenet.model:ConformerModel",
        config="oasr_models_wenet.config:ConformerModelConfig",
        converter="oasr_models_wenet.convert:WenetConverter",
        description="WeNet U2/U2++ Conformer: CTC, CTC + attention rescoring, chunk streaming",
    )


@hookimpl
def oasr_register_decoders(register) -> None:
    register("ctc_aed_rescoring", "oasr_models_wenet.decode:CtcAedRescoringStrategy")
