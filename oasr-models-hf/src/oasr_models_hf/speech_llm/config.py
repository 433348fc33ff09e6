"""Qwen2-Audio's model config: the Whisper-geometry audio tower, the Qwen2 language model and the prompt ids.

Field names follow transformers' ``Qwen2AudioEncoderConfig`` (``audio``) and ``Qwen2Config`` (``text``);
every default is transformers' own, so a ``text_config`` that omits fields (the published 7B relies on
Qwen2 defaults) reads as transformers reads it.

:class:`SpeechLlmPrompt` holds what the prompt is built from: the audio placeholder ids, the stop
tokens, and the default instruction that follows the audio.  The ASR instruction is Qwen2-Audio's
own (its paper and model card): ``"Detect the language and recognize the speech:"``; a request's
``DecodingOptions.prompt`` replaces it, and ``DecodingOptions.language`` appends the language tag
(``<|en|>``) where the vocabulary has one.
"""

from __future__ import annotations

import attrs

from oasr.errors import ConfigError
from oasr.models.base import BaseModelConfig

ASR_INSTRUCTION = "Detect the language and recognize the speech:"


@attrs.define(kw_only=True)
class AudioTowerConfig:
    """transformers ``Qwen2AudioEncoderConfig`` (a Whisper encoder with a pooled, normed output)."""

    num_mel_bins: int = 128
    d_model: int = 1280
    encoder_layers: int = 32
    encoder_attention_heads: int = 20
    encoder_ffn_dim: int = 5120
    max_source_positions: int = 1500
    activation_function: str = "gelu"

    def __attrs_post_init__(self) -> None:
        if self.d_model % self.encoder_attention_heads:
            raise ConfigError(f"audio d_model {self.d_model} is not divisible by {self.encoder_attention_heads} heads",
                              key="audio.encoder_attention_heads")
        if self.activation_function != "gelu":
            raise ConfigError(f"the Qwen2-Audio tower uses gelu, got {self.activation_function!r}",
                              key="audio.activation_function")

    @property
    def window_frames(self) -> int:
        """Log-mel frames of one window (30 s): two per tower position."""
        return 2 * self.max_source_positions


@attrs.define(kw_only=True)
class TextConfig:
    """transformers ``Qwen2Config``: the causal LM's shape (defaults are Qwen2's)."""

    vocab_size: int = 151936
    hidden_size: int = 4096
    intermediate_size: int = 22016
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int = 32
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False

    def __attrs_post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(f"{self.num_attention_heads} attention heads are not a multiple of "
                              f"{self.num_key_value_heads} key/value heads", key="text.num_key_value_heads")
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ConfigError(f"hidden_size {self.hidden_size} is not divisible by {self.num_attention_heads} heads",
                              key="text.num_attention_heads")
        if self.dim_per_head % 2:
            raise ConfigError(f"head_dim {self.dim_per_head} must be even for RoPE", key="text.head_dim")

    @property
    def dim_per_head(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_attention_heads


def _ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


@attrs.define(kw_only=True)
class SpeechLlmPrompt:
    """The prompt's token ids and the default instruction (see the module docstring)."""

    audio_token_id: int
    audio_bos_id: int
    audio_eos_id: int
    #: generation stops at any of these (HF's ``eos_token_id`` list)
    eos_token_ids: tuple[int, ...] = attrs.field(converter=_ids)
    pad_token_id: int | None = None
    instruction: str = ASR_INSTRUCTION
    #: bare language code → its tag token id (``"en"`` → id of ``<|en|>``); empty: no language tags
    languages: dict[str, int] = attrs.field(factory=dict, converter=dict)

    def __attrs_post_init__(self) -> None:
        if not self.eos_token_ids:
            raise ConfigError("a speech LLM needs at least one stop (eos) token id", key="prompt.eos_token_ids")


@attrs.define(kw_only=True)
class SpeechLlmConfig(BaseModelConfig):
    audio: AudioTowerConfig = attrs.field(factory=AudioTowerConfig)
    text: TextConfig = attrs.field(factory=TextConfig)
    prompt: SpeechLlmPrompt

    def __attrs_post_init__(self) -> None:
        ids = [self.prompt.audio_token_id, self.prompt.audio_bos_id, self.prompt.audio_eos_id,
               *self.prompt.eos_token_ids, *self.prompt.languages.values()]
        bad = [i for i in ids if not 0 <= i < self.text.vocab_size]
        if bad:
            raise ConfigError(f"prompt token ids {bad} lie outside the LM vocabulary of {self.text.vocab_size}",
                              key="prompt")

    @classmethod
    def tiny(cls) -> SpeechLlmConfig:
        return cls(audio=AudioTowerConfig(num_mel_bins=16, d_model=32, encoder_layers=1, encoder_attention_heads=2,
                                          encoder_ffn_dim=64, max_source_positions=1500),
                   text=TextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2),
                   prompt=SpeechLlmPrompt(audio_token_id=60, audio_bos_id=61, audio_eos_id=62, eos_token_ids=(63,)))
