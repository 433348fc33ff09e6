"""Qwen2-Audio on the layer waist: audio tower, projector and Qwen2 LM, module names as transformers 4.x.

``audio_tower`` (Whisper geometry: conv1, conv2 stride 2, learned positions, pre-norm layers, then
``AvgPool1d(2)`` and a post-pool ``layer_norm``), ``multi_modal_projector.linear`` and
``language_model`` (:class:`~oasr_models_hf.speech_llm.llm.Qwen2Lm`: ``language_model.model.*`` and
``language_model.lm_head``).  :attr:`SpeechLlmModel.weight_renames` reads transformers 5.x checkpoints
too (``model.audio_tower.*``, ``model.language_model.*``, ``lm_head.*``) and 5.x re-saves of 4.x ones
(``language_model.model.model.*``).

The tower's attention mask is key padding only, from HF's two-stage valid length: a row of ``F``
valid log-mel frames has ``(F - 1) // 2 + 1`` tower positions and ``(that - 2) // 2 + 1`` audio tokens
after pooling.  Valid outputs read mel frames ``[0, F + 2)`` only (two k=3 convolutions), so the tower
runs over the longest row's frames plus that margin rather than the whole 30 s window: the audio
tokens are those of the full window, computed over less padding.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from oasr.errors import CapabilityError, CheckpointFormatError
from oasr.layers import Conv1d, Embedding, Gelu, LayerNorm, Linear, LinearActivation, MultiHeadAttention
from oasr.models.base import BaseAsrModel, BaseEncoder
from oasr.models.specs import LoadReport, QuantLayout, SmoothGroup
from oasr_models_hf.speech_llm.config import AudioTowerConfig, SpeechLlmConfig
from oasr_models_hf.speech_llm.llm import Qwen2Lm

_TOWER_ATTN_BIAS = (True, False, True, True)  # the tower's k_proj has no bias, as Whisper's


def audio_token_count(mel_frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's two-stage lengths: (tower positions, audio tokens) of rows with ``mel_frames`` valid frames."""
    positions = (mel_frames - 1) // 2 + 1
    return positions, (positions - 2) // 2 + 1


class AudioTowerLayer(nn.Module):
    def __init__(self, d_model: int, heads: int, ffn_dim: int):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, heads, bias=_TOWER_ATTN_BIAS)
        self.self_attn_layer_norm = LayerNorm(d_model)
        self.fc1 = LinearActivation(d_model, ffn_dim, "gelu")
        self.fc2 = Linear(ffn_dim, d_model)
        self.final_layer_norm = LayerNorm(d_model)

    def forward(self, x: torch.Tensor, key_lengths: torch.Tensor | None) -> torch.Tensor:
        attn = self.self_attn(self.self_attn_layer_norm(x), key_lengths=key_lengths)
        normed, x = self.final_layer_norm.add_forward(attn, x)
        return x + self.fc2(self.fc1(normed))


class AudioTower(BaseEncoder):
    """Log-mel (B, T, n_mels), T <= 3000 → pooled, normed features (B, T / 4, d_model) and token counts."""

    streaming_kind = "none"
    subsampling_rate = 4

    def __init__(self, config: AudioTowerConfig):
        super().__init__()
        d = config.d_model
        self.config = config
        self.conv1 = Conv1d(config.num_mel_bins, d, 3, padding=1)
        self.conv2 = Conv1d(d, d, 3, stride=2, padding=1)
        self.act = Gelu()
        self.embed_positions = Embedding(config.max_source_positions, d)
        self.layers = nn.ModuleList(AudioTowerLayer(d, config.encoder_attention_heads, config.encoder_ffn_dim)
                                    for _ in range(config.encoder_layers))
        self.layer_norm = LayerNorm(d)

    @property
    def output_size(self) -> int:
        return self.config.d_model

    def forward(self, feats: torch.Tensor, feat_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        window = self.config.window_frames
        if feats.shape[1] > window:
            raise CapabilityError(f"the Qwen2-Audio tower reads at most {window} log-mel frames (30 s); got "
                                  f"{feats.shape[1]}")
        feat_lens = feat_lens.to(feats.device).long()
        span = min(window, int(feat_lens.max()) + 2 if feat_lens.numel() else 2)
        span += span % 2
        x = feats[:, :span]
        if x.shape[1] < span:  # the window's zero-signal frames are what a row shorter than the margin reads
            x = F.pad(x, (0, 0, 0, span - x.shape[1]))
        x = self.act(self.conv2(self.act(self.conv1(x))))
        x = x + self.embed_positions.weight[: x.shape[1]].to(x.dtype)
        positions, tokens = audio_token_count(feat_lens)
        key_lengths = positions if bool((positions < x.shape[1]).any()) else None
        for layer in self.layers:
            x = layer(x, key_lengths)
        pooled = F.avg_pool1d(x.transpose(1, 2), 2, 2).transpose(1, 2)
        return self.layer_norm(pooled), tokens


class MultiModalProjector(nn.Module):
    def __init__(self, config: SpeechLlmConfig):
        super().__init__()
        self.linear = Linear(config.audio.d_model, config.text.hidden_size, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class SpeechLlmModel(BaseAsrModel):
    """Qwen2-Audio: audio tokens from the tower, projected into a Qwen2 LM's prompt; decoded by ``llm``."""

    config_class = SpeechLlmConfig
    weight_renames = (
        (r"^model\.audio_tower\.", "audio_tower."),
        (r"^model\.multi_modal_projector\.", "multi_modal_projector."),
        (r"^model\.language_model\.", "language_model.model."),
        (r"^lm_head\.", "language_model.lm_head."),
        (r"^language_model\.model\.model\.", "language_model.model."),
    )

    def __init__(self, config: SpeechLlmConfig):
        super().__init__(config)
        self.audio_tower = AudioTower(config.audio)
        self.multi_modal_projector = MultiModalProjector(config)
        self.language_model = Qwen2Lm(config.text)

    @property
    def encoder(self) -> AudioTower:  # type: ignore[override]
        return self.audio_tower

    @property
    def capabilities(self) -> frozenset[str]:
        return frozenset({"llm"})

    def _tied(self) -> bool:
        lm = self.language_model
        return lm.lm_head.weight is lm.model.embed_tokens.weight

    def is_computed_buffer(self, key: str) -> bool:
        if key == "language_model.lm_head.weight" and self._tied():
            return True
        return super().is_computed_buffer(key)

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> LoadReport:
        """4.x or 5.x keys; with tied embeddings a stored ``lm_head.weight`` must equal the embedding."""
        if self._tied():
            remapped = self.remap_state_dict(state_dict)
            head, embed = remapped.get("language_model.lm_head.weight"), remapped.get(
                "language_model.model.embed_tokens.weight")
            if head is not None and embed is not None and not torch.equal(head, embed):
                raise CheckpointFormatError("lm_head.weight differs from embed_tokens.weight although the text "
                                            "config ties them (tie_word_embeddings: true)")
        return super().load_weights(state_dict)

    def encode_offline(self, feats: torch.Tensor, feat_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-mel (B, T, n_mels) → audio token embeddings in the LM's space (B, N, D) and counts (B,)."""
        pooled, tokens = self.audio_tower(feats, feat_lens)
        return self.multi_modal_projector(pooled), tokens

    def quantization_layout(self) -> QuantLayout:
        """int8 goes to the LM (where decode time goes); the tower and projector stay at full precision."""
        groups = []
        for i in range(len(self.language_model.model.layers)):
            base = f"language_model.model.layers.{i}"
            groups.append(SmoothGroup(f"{base}.input_layernorm",
                                      tuple(f"{base}.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj"))))
            groups.append(SmoothGroup(f"{base}.post_attention_layernorm",
                                      (f"{base}.mlp.gate_proj", f"{base}.mlp.up_proj")))
        return QuantLayout(smooth_groups=tuple(groups), keep_full_precision=("audio_tower", "multi_modal_projector"))

    def extra_repr(self) -> str:
        a, t = self.config.audio, self.config.text
        return (f"tower d_model={a.d_model} x{a.encoder_layers}, lm hidden={t.hidden_size} x{t.num_hidden_layers}, "
                f"vocab={t.vocab_size}")


__all__ = ["AudioTower", "SpeechLlmModel"]
