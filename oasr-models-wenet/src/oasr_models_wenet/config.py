"""Configuration of the WeNet U2/U2++ Conformer (``conformer`` architecture).

Field names follow WeNet's ``train.yaml`` (``encoder_conf`` / ``decoder_conf``) wherever a field
means the same thing, so the converter's key tables map 1:1 and a reader who knows WeNet recognises
every knob.  Only what changes the inference graph is kept; training knobs (dropout rates, gradient
checkpointing, SDPA switches) are dropped by the converter.
"""

from __future__ import annotations

import attrs

from oasr.models import BaseModelConfig

#: ``input_layer`` → (subsampling rate, right context in feature frames, conv (kernel, stride) stages)
SUBSAMPLING = {
    "conv2d": (4, 6, ((3, 2), (3, 2))),
    "conv2d6": (6, 10, ((3, 2), (5, 3))),
    "conv2d8": (8, 14, ((3, 2), (3, 2), (3, 2))),
}
ENCODER_ACTIVATIONS = ("swish", "relu")
CONV_NORMS = ("batch_norm", "layer_norm")
DECODER_ACTIVATIONS = ("relu", "swish", "gelu")


@attrs.define(kw_only=True)
class ConformerEncoderConfig:
    """WeNet's ``ConformerEncoder`` as this implementation builds it (pre-norm, rel_pos, rel_selfattn)."""

    input_dim: int = 80
    output_size: int = 256
    attention_heads: int = 4
    linear_units: int = 2048
    num_blocks: int = 12
    input_layer: str = attrs.field(default="conv2d", validator=attrs.validators.in_(tuple(SUBSAMPLING)))
    macaron_style: bool = True
    use_cnn_module: bool = True
    cnn_module_kernel: int = 15
    cnn_module_norm: str = attrs.field(default="batch_norm", validator=attrs.validators.in_(CONV_NORMS))
    conv_inner_factor: int = 2
    causal: bool = False
    activation_type: str = attrs.field(default="swish", validator=attrs.validators.in_(ENCODER_ACTIVATIONS))
    query_bias: bool = True
    key_bias: bool = True
    value_bias: bool = True
    conv_bias: bool = True
    mlp_bias: bool = True
    norm_eps: float = 1e-5
    conv_norm_eps: float = 1e-5
    final_norm: bool = True
    #: the checkpoint was trained with dynamic chunk masks (U2/U2++): it can stream
    use_dynamic_chunk: bool = False
    use_dynamic_left_chunk: bool = False
    #: global CMVN buffers (``encoder.global_cmvn.{mean,istd}``) precede the subsampling
    global_cmvn: bool = True

    @property
    def head_dim(self) -> int:
        return self.output_size // self.attention_heads

    @property
    def conv_channels(self) -> int:
        """Channels of the depthwise convolution (after the GLU)."""
        return self.conv_inner_factor * self.output_size // 2


@attrs.define(kw_only=True)
class TransformerDecoderConfig:
    """WeNet's ``TransformerDecoder`` / ``BiTransformerDecoder`` (the attention-rescoring branch).

    ``bidirectional`` builds ``right_decoder`` beside ``left_decoder`` (WeNet's ``bitransformer``,
    whose right decoder exists even with ``r_num_blocks: 0``).  ``sos_id``/``eos_id`` and the trained
    ``reverse_weight`` travel here because rescoring needs them and nothing else does.
    """

    vocab_size: int
    d_model: int
    attention_heads: int = 4
    linear_units: int = 2048
    num_blocks: int = 6
    r_num_blocks: int = 0
    bidirectional: bool = True
    activation_type: str = attrs.field(default="relu", validator=attrs.validators.in_(DECODER_ACTIVATIONS))
    query_bias: bool = True
    key_bias: bool = True
    value_bias: bool = True
    src_query_bias: bool = True
    src_key_bias: bool = True
    src_value_bias: bool = True
    mlp_bias: bool = True
    norm_eps: float = 1e-5
    sos_id: int
    eos_id: int
    reverse_weight: float = 0.0


@attrs.define(kw_only=True)
class ConformerModelConfig(BaseModelConfig):
    """A U2/U2++ model: Conformer encoder, CTC head, optional attention decoder."""

    vocab_size: int
    encoder: ConformerEncoderConfig
    decoder: TransformerDecoderConfig | None = None
    blank_id: int = 0

    @classmethod
    def tiny(cls) -> ConformerModelConfig:
        encoder = ConformerEncoderConfig(
            input_dim=20, output_size=32, attention_heads=2, linear_units=48, num_blocks=2,
            cnn_module_kernel=5, causal=True, cnn_module_norm="layer_norm", use_dynamic_chunk=True,
        )
        decoder = TransformerDecoderConfig(vocab_size=12, d_model=32, attention_heads=2, linear_units=48,
                                           num_blocks=1, r_num_blocks=1, sos_id=11, eos_id=11, reverse_weight=0.3)
        return cls(vocab_size=12, encoder=encoder, decoder=decoder)
