"""Hook implementations of oasr-models-icefall (registers by string; imports no model code)."""

from __future__ import annotations

from oasr.hookspecs import hookimpl


@hookimpl
def oasr_register_models(register) -> None:
    register(
        "zipformer",
        model="oasr_models_icefall.zipformer.model:ZipformerCtcModel",
        config="oasr_models_icefall.zipformer.config:ZipformerCtcModelConfig",
        converter="oasr_models_icefall.zipformer.convert:IcefallConverter",
        description="icefall Zipformer2 + CTC (causal releases stream on the slot backend)",
    )
    register(
        "transducer",
        model="oasr_models_icefall.transducer.model:TransducerModel",
        config="oasr_models_icefall.transducer.config:TransducerModelConfig",
        converter="oasr_models_icefall.transducer.convert:IcefallTransducerConverter",
        description="icefall RNN-T: Zipformer2 + stateless decoder + joiner (load with architecture='transducer')",
    )
    register(
        "icefall_conformer",
        model="oasr_models_icefall.conformer_ctc3.model:ConformerCtcModel",
        config="oasr_models_icefall.conformer_ctc3.config:ConformerCtcConfig",
        converter="oasr_models_icefall.conformer_ctc3.convert:IcefallConformerCtcConverter",
        description="icefall conformer_ctc3: scaled Conformer (BasicNorm, DoubleSwish) + CTC",
    )
