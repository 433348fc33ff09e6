"""The ``sensevoice`` architecture: FunASR's SenseVoice-Small (multilingual CTC with rich tags).

Four query embeddings are prepended to the CMVN'd LFR features, as FunASR's ``SenseVoiceSmall``
does: ``[language, event, emotion, text-norm, features...]`` (table rows: the language's row, 1, 2,
and 14 ``withitn`` / 15 ``woitn``).  The SANM encoder (with its ``tp_blocks``) and the CTC head then
emit, normally in its first four frames, the language, emotion, event and text-norm tags
(``<|en|>``, ``<|NEUTRAL|>``, ``<|Speech|>``, ``<|woitn|>``) ahead of the transcript's tokens.
"""

from __future__ import annotations

import torch

from oasr import layers
from oasr.models import BaseAsrModel
from oasr_models_funasr.config import SenseVoiceConfig
from oasr_models_funasr.encoder import SANMEncoder

#: DecodingOptions.language → query row (FunASR's ``lid_dict``); None means "auto"
LANGUAGE_QUERIES = {"auto": 0, "zh": 3, "en": 4, "yue": 7, "ja": 11, "ko": 12, "nospeech": 13}
EVENT_QUERY, EMOTION_QUERY = 1, 2
TEXT_NORM_QUERIES = {"withitn": 14, "woitn": 15}
#: tag pieces the CTC head emits, by the RequestOutput field they fill
TAG_CLASSES = {
    "language": ("zh", "en", "yue", "ja", "ko", "nospeech"),
    "emotion": ("HAPPY", "SAD", "ANGRY", "NEUTRAL", "FEARFUL", "DISGUSTED", "SURPRISED", "EMO_UNKNOWN"),
    "event": ("BGM", "Speech", "Applause", "Laughter", "Cry", "Sneeze", "Breath", "Cough", "Sing", "Speech_Noise",
              "Event_UNK", "GBG"),
    "text_norm": ("withitn", "woitn"),
}
NUM_QUERIES = 4


class SenseVoiceModel(BaseAsrModel):
    """``encoder``, ``embed`` (the query table) and ``ctc.ctc_lo``; keys are FunASR's."""

    config_class = SenseVoiceConfig
    weight_renames = ((r"\.self_attn\.fsmn_block\.", ".self_attn.fsmn.fsmn_block."),)

    def __init__(self, config: SenseVoiceConfig):
        super().__init__(config)
        self.encoder = SANMEncoder(config.encoder)
        self.embed = layers.Embedding(config.num_queries, config.encoder.input_size)
        self.ctc = CtcHead(config.encoder.output_size, config.vocab_size)

    @property
    def capabilities(self) -> frozenset[str]:
        return frozenset({"sensevoice"})

    def queries(self, language_rows: torch.Tensor, text_norm_row: int) -> torch.Tensor:
        """(B,) language rows → the (B, 4, input_size) query prefix."""
        batch = language_rows.shape[0]
        rows = torch.stack([language_rows, torch.full_like(language_rows, EVENT_QUERY),
                            torch.full_like(language_rows, EMOTION_QUERY),
                            torch.full_like(language_rows, text_norm_row)], dim=1)
        return self.embed(rows.reshape(batch, NUM_QUERIES))

    def encode_offline(self, feats: torch.Tensor, feat_lens: torch.Tensor, language_rows: torch.Tensor | None = None,
                       text_norm_row: int = TEXT_NORM_QUERIES["woitn"]) -> tuple[torch.Tensor, torch.Tensor]:
        """LFR features (before CMVN) → encoder output over the 4 queries + the features."""
        if language_rows is None:
            language_rows = torch.zeros(feats.shape[0], dtype=torch.long, device=feats.device)
        return self.encoder(feats, feat_lens, prefix=self.queries(language_rows.to(feats.device), text_norm_row))

    def ctc_log_probs(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.ctc(hidden)


class CtcHead(torch.nn.Module):
    """FunASR's ``CTC`` module at inference: ``log_softmax(ctc_lo(x))``."""

    def __init__(self, d_model: int, vocab_size: int):
        super().__init__()
        self.ctc_lo = layers.CtcProjection(d_model, vocab_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.ctc_lo(hidden)
