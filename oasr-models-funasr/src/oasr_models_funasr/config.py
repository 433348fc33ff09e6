"""Configuration of FunASR's Paraformer (``paraformer`` architecture).

Field names follow FunASR's ``config.yaml`` (``encoder_conf`` / ``decoder_conf`` / ``predictor_conf``)
wherever a field means the same thing, so the converter copies them by name and a reader who knows
FunASR recognises every knob.  Only what changes the inference graph is kept.
"""

from __future__ import annotations

import attrs

from oasr.models import BaseModelConfig


@attrs.define(kw_only=True)
class SANMEncoderConfig:
    """FunASR's ``SANMEncoder`` with ``input_layer: pe`` (sinusoidal positions added to the input)."""

    input_size: int = 560
    output_size: int = 512
    attention_heads: int = 4
    linear_units: int = 2048
    num_blocks: int = 50
    kernel_size: int = 11
    sanm_shfit: int = 0
    #: SenseVoice's extra blocks after ``after_norm``, followed by ``tp_norm`` (Paraformer has neither)
    tp_blocks: int = 0
    tp_norm: bool = False
    #: LayerNorm epsilon: ESPnet's 1e-12 in Paraformer's SANM, PyTorch's 1e-5 in SenseVoice's
    norm_eps: float = 1e-12
    #: CMVN (``am.mvn``) applied inside the encoder from ``cmvn_shift`` / ``cmvn_scale`` buffers
    cmvn: bool = True

    @property
    def head_dim(self) -> int:
        return self.output_size // self.attention_heads


@attrs.define(kw_only=True)
class SANMDecoderConfig:
    """FunASR's ``ParaformerSANMDecoder``: ``att_layer_num`` blocks with FSMN self-attention and
    cross-attention, ``num_blocks - att_layer_num`` FSMN-only blocks, then one FFN-only block."""

    vocab_size: int
    d_model: int
    attention_heads: int = 4
    linear_units: int = 2048
    num_blocks: int = 16
    att_layer_num: int = 16
    kernel_size: int = 11
    sanm_shfit: int = 0


@attrs.define(kw_only=True)
class CifPredictorConfig:
    """``CifPredictorV2`` (and, with ``upsample_times > 0``, ``CifPredictorV3``'s timestamp head)."""

    idim: int
    l_order: int = 1
    r_order: int = 1
    threshold: float = 1.0
    smooth_factor: float = 1.0
    noise_threshold: float = 0.0
    tail_threshold: float = 0.0
    tail_mask: bool = True
    #: BiCifParaformer's timestamp head (CifPredictorV3): 0 means the checkpoint has none
    upsample_times: int = 0
    upsample_type: str = attrs.field(default="cnn_blstm", validator=attrs.validators.in_(("cnn", "cnn_blstm")))
    use_cif1_cnn: bool = True
    smooth_factor2: float = 1.0
    noise_threshold2: float = 0.0


@attrs.define(kw_only=True)
class ParaformerConfig(BaseModelConfig):
    """A Paraformer (or BiCifParaformer when ``predictor.upsample_times > 0``)."""

    vocab_size: int
    encoder: SANMEncoderConfig
    decoder: SANMDecoderConfig
    predictor: CifPredictorConfig
    blank_id: int = 0
    sos_id: int = 1
    eos_id: int = 2

    @property
    def has_timestamp_head(self) -> bool:
        return self.predictor.upsample_times > 0

    @classmethod
    def tiny(cls) -> ParaformerConfig:
        encoder = SANMEncoderConfig(input_size=40, output_size=32, attention_heads=2, linear_units=48, num_blocks=2,
                                    kernel_size=5)
        decoder = SANMDecoderConfig(vocab_size=12, d_model=32, attention_heads=2, linear_units=48, num_blocks=2,
                                    att_layer_num=2, kernel_size=5)
        predictor = CifPredictorConfig(idim=32, tail_threshold=0.45, upsample_times=3)
        return cls(vocab_size=12, encoder=encoder, decoder=decoder, predictor=predictor)


@attrs.define(kw_only=True)
class SenseVoiceConfig(BaseModelConfig):
    """SenseVoice-Small: the SANM encoder (with ``tp_blocks``) under a CTC head, fed four query
    embeddings (language, event, emotion, text normalization) before the features."""

    vocab_size: int
    encoder: SANMEncoderConfig
    blank_id: int = 0
    #: rows of the query embedding table (FunASR: 7 + 7 languages + 2 text-norm modes)
    num_queries: int = 16

    @classmethod
    def tiny(cls) -> SenseVoiceConfig:
        encoder = SANMEncoderConfig(input_size=40, output_size=32, attention_heads=2, linear_units=48, num_blocks=2,
                                    tp_blocks=1, tp_norm=True, kernel_size=5, norm_eps=1e-5)
        return cls(vocab_size=24, encoder=encoder)
