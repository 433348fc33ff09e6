"""Whisper's model config: the shape of the network plus its generation-control ids.

The network fields mirror Hugging Face's ``WhisperConfig`` names (``d_model``, ``encoder_layers`` ...).
The generation-control ids (start/end of transcript, language and task tokens, the timestamp range,
suppress lists, alignment heads) are a property of the checkpoint's vocabulary and training, so they
travel with the model config (:class:`WhisperGeneration`) into the native bundle; the ``aed`` decode
strategy reads them from here, never from engine-side defaults.
"""

from __future__ import annotations

import attrs

from oasr.errors import ConfigError
from oasr.models.base import BaseModelConfig

#: seconds of audio one Whisper window covers, and the feature frame rate of the log-mel
WINDOW_SECONDS = 30
HOP_LENGTH = 160
SAMPLE_RATE = 16000
#: log-mel frames in one window
WINDOW_FRAMES = WINDOW_SECONDS * SAMPLE_RATE // HOP_LENGTH


def _tuple_of_ints(value) -> tuple[int, ...]:
    return tuple(int(v) for v in (value or ()))


def _heads(value) -> tuple[tuple[int, int], ...]:
    return tuple((int(layer), int(head)) for layer, head in (value or ()))


@attrs.frozen(kw_only=True)
class WhisperGeneration:
    """The special token ids a Whisper checkpoint is decoded with.

    ``languages`` maps a bare language code (``"en"``) to its token id; an English-only checkpoint
    has an empty map (it takes no language token).  Timestamp tokens start right after
    ``no_timestamps_id`` and step by ``time_precision`` seconds.
    """

    eot_id: int
    sot_id: int
    no_timestamps_id: int
    sot_prev_id: int | None = None
    sot_lm_id: int | None = None
    no_speech_id: int | None = None
    transcribe_id: int | None = None
    translate_id: int | None = None
    languages: dict[str, int] = attrs.field(factory=dict, converter=dict)
    suppress_tokens: tuple[int, ...] = attrs.field(default=(), converter=_tuple_of_ints)
    begin_suppress_tokens: tuple[int, ...] = attrs.field(default=(), converter=_tuple_of_ints)
    #: (decoder layer, head) pairs whose cross-attention follows the audio (word timings)
    alignment_heads: tuple[tuple[int, int], ...] = attrs.field(default=(), converter=_heads)
    #: latest first timestamp, in timestamp steps (1.0 s at 0.02 s per step)
    max_initial_timestamp_index: int | None = 50
    time_precision: float = 0.02

    @property
    def timestamp_begin(self) -> int:
        return self.no_timestamps_id + 1

    @property
    def is_multilingual(self) -> bool:
        return bool(self.languages)

    def language_id(self, code: str) -> int:
        """The token id of language ``code``; raise :class:`ConfigError` naming the known codes."""
        try:
            return self.languages[code]
        except KeyError:
            known = ", ".join(sorted(self.languages)) or "(none: this checkpoint is English-only)"
            raise ConfigError(f"language {code!r} is not one of this Whisper checkpoint's languages: {known}",
                              key="language") from None


@attrs.define(kw_only=True)
class WhisperConfig(BaseModelConfig):
    """Encoder-decoder Transformer shape (Hugging Face field names) and generation ids."""

    vocab_size: int = 51865
    num_mel_bins: int = 80
    d_model: int = 384
    encoder_layers: int = 4
    encoder_attention_heads: int = 6
    encoder_ffn_dim: int = 1536
    decoder_layers: int = 4
    decoder_attention_heads: int = 6
    decoder_ffn_dim: int = 1536
    max_source_positions: int = 1500
    max_target_positions: int = 448
    activation_function: str = "gelu"
    scale_embedding: bool = False
    generation: WhisperGeneration

    def __attrs_post_init__(self) -> None:
        for name, heads in (("encoder", self.encoder_attention_heads), ("decoder", self.decoder_attention_heads)):
            if self.d_model % heads:
                raise ConfigError(f"d_model {self.d_model} is not divisible by {name}_attention_heads {heads}",
                                  key=f"{name}_attention_heads")
        if self.activation_function != "gelu":
            raise ConfigError(f"Whisper activation_function must be 'gelu', got {self.activation_function!r}",
                              key="activation_function")
        if self.scale_embedding:
            raise ConfigError("Whisper checkpoints never scale embeddings; scale_embedding=True is not supported",
                              key="scale_embedding")
        gen = self.generation
        last = gen.timestamp_begin + int(round(WINDOW_SECONDS / gen.time_precision))
        if last >= self.vocab_size or gen.eot_id >= self.vocab_size:
            raise ConfigError(
                f"the generation ids do not fit the vocabulary: timestamps end at id {last}, eot is "
                f"{gen.eot_id}, vocab_size is {self.vocab_size}", key="generation")
        for layer, head in gen.alignment_heads:
            if not (0 <= layer < self.decoder_layers and 0 <= head < self.decoder_attention_heads):
                raise ConfigError(f"alignment head ({layer}, {head}) is outside the decoder's "
                                  f"{self.decoder_layers} layers x {self.decoder_attention_heads} heads",
                                  key="generation.alignment_heads")

    @property
    def input_frames(self) -> int:
        """Log-mel frames of one encoder window (two per encoder position)."""
        return 2 * self.max_source_positions

    @classmethod
    def tiny(cls) -> WhisperConfig:
        return cls(vocab_size=51865, d_model=32, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=64,
                   decoder_layers=1, decoder_attention_heads=2, decoder_ffn_dim=64,
                   generation=multilingual_generation(alignment_heads=((0, 0),)))


def multilingual_generation(*, languages: tuple[str, ...] = ("en", "zh", "de"),
                            alignment_heads: tuple[tuple[int, int], ...] = ()) -> WhisperGeneration:
    """Generation ids laid out as in OpenAI's multilingual vocabulary (language tokens right after
    <|startoftranscript|>), for ``len(languages)`` languages: with 99 they are the real ids."""
    eot = 50257
    table = {code: eot + 2 + i for i, code in enumerate(languages)}
    after = eot + 2 + len(languages)
    return WhisperGeneration(
        eot_id=eot, sot_id=eot + 1, languages=table, translate_id=after, transcribe_id=after + 1,
        sot_lm_id=after + 2, sot_prev_id=after + 3, no_speech_id=after + 4, no_timestamps_id=after + 5,
        begin_suppress_tokens=(220, eot), alignment_heads=alignment_heads,
    )
