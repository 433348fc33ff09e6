"""The Qwen2-Audio converter: a Hugging Face ``qwen2_audio`` directory becomes a ``speech_llm`` model.

Claimed by ``config.json`` ``model_type: "qwen2_audio"`` (specificity 30).  ``audio_config`` and
``text_config`` fields the file omits take transformers' defaults (the published 7B's ``text_config``
lists only what differs from ``Qwen2Config``); RoPE is read from 5.x ``rope_parameters`` or 4.x
``rope_theta``.  Weights: ``model.safetensors``, sharded safetensors or ``pytorch_model.bin``, in the
4.x or 5.x key layout; a stored ``lm_head`` is used even where ``text_config`` says
``tie_word_embeddings`` (transformers' Qwen2-Audio never ties it).  The tokenizer is the folder's ``tokenizer.json``; the prompt's special ids
(``<|AUDIO|>``, ``<|audio_bos|>``, ``<|audio_eos|>``) and the language tags (``<|en|>`` ...) are read
from its vocabulary, the stop tokens from ``generation_config.json`` (else the config's
``eos_token_id``).  Features: ``whisper_logmel`` with 128 bins and the 30 s window, as
``WhisperFeatureExtractor(feature_size=128)`` computes them for the processor.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import attrs
import torch

from oasr.checkpoints.converter import DETECT_KEYED_VALUE, CheckpointConverter
from oasr.errors import CheckpointFormatError, UnsupportedConfigError
from oasr.models.specs import DecodingDefaults, FeatureSpec, TokenizerSpec
from oasr_models_hf.lasr.convert import load_hf_weights, model_type, read_json, rope_theta
from oasr_models_hf.speech_llm.config import AudioTowerConfig, SpeechLlmConfig, SpeechLlmPrompt, TextConfig

MODEL_TYPE = "qwen2_audio"
_AUDIO, _BOS, _EOS = "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>"
_LANGUAGE_TAG = re.compile(r"^<\|([a-z]{2,3})\|>$")
#: seconds of audio one request may carry: the feature extractor truncates to one 30 s window
WINDOW_SECONDS = 30.0


def _fields(cls: type, raw: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in attrs.fields(cls)}
    return {k: v for k, v in raw.items() if k in names}


def _vocabulary(path: Path) -> dict[str, int]:
    data = read_json(path)
    vocab = dict(data.get("model", {}).get("vocab", {}) or {})
    for added in data.get("added_tokens", []):
        vocab[added["content"]] = int(added["id"])
    return vocab


class Qwen2AudioConverter(CheckpointConverter):
    """A Hugging Face Qwen2-Audio directory."""

    architecture = "speech_llm"
    detect_specificity = DETECT_KEYED_VALUE

    def detect(self, path: Path) -> bool:
        return model_type(Path(path)) == MODEL_TYPE

    def load_state_dict(self, path: Path) -> dict[str, torch.Tensor]:
        return load_hf_weights(Path(path))

    def build_config(self, path: Path, state_dict: dict[str, torch.Tensor]) -> SpeechLlmConfig:
        path = Path(path)
        raw = read_json(path / "config.json")
        audio_raw, text_raw = raw.get("audio_config") or {}, raw.get("text_config") or {}
        if audio_raw.get("scale_embedding"):
            raise UnsupportedConfigError(f"{path}/config.json: audio_config.scale_embedding is not a Qwen2-Audio "
                                         f"setting", path=path, key="audio_config.scale_embedding")
        if text_raw.get("use_sliding_window"):
            raise UnsupportedConfigError(f"{path}/config.json: text_config.use_sliding_window is set; OASR's Qwen2 "
                                         f"attends over the whole context", path=path, key="text_config.use_sliding_window")
        if text_raw.get("hidden_act", "silu") != "silu":
            raise UnsupportedConfigError(f"{path}/config.json: text_config.hidden_act {text_raw['hidden_act']!r} "
                                         f"(OASR's Qwen2 builds silu)", path=path, key="text_config.hidden_act")
        text = dict(_fields(TextConfig, text_raw), rope_theta=rope_theta(text_raw, path))
        # transformers' Qwen2-Audio never ties its lm_head (whatever text_config says): a stored head is used
        heads = ("lm_head.weight", "language_model.lm_head.weight")
        text["tie_word_embeddings"] = bool(text.get("tie_word_embeddings")) and not any(k in state_dict for k in heads)
        if "num_key_value_heads" in text_raw and text_raw["num_key_value_heads"] is None:
            text["num_key_value_heads"] = text.get("num_attention_heads", 32)  # Qwen2Config's null: one per head
        return SpeechLlmConfig(audio=AudioTowerConfig(**_fields(AudioTowerConfig, audio_raw)),
                               text=TextConfig(**text), prompt=self._prompt(path, raw))

    def _prompt(self, path: Path, raw: dict[str, Any]) -> SpeechLlmPrompt:
        tokenizer = path / "tokenizer.json"
        if not tokenizer.is_file():
            raise CheckpointFormatError(f"{path} has no tokenizer.json: a Qwen2-Audio checkpoint needs its tokenizer",
                                        path=path)
        vocab = _vocabulary(tokenizer)
        missing = [t for t in (_BOS, _EOS) if t not in vocab]
        if missing:
            raise CheckpointFormatError(f"{tokenizer} has no {', '.join(missing)} token: not a Qwen2-Audio vocabulary",
                                        path=tokenizer)
        gen = read_json(path / "generation_config.json") if (path / "generation_config.json").is_file() else {}
        text_raw = raw.get("text_config") or {}
        eos = gen.get("eos_token_id", text_raw.get("eos_token_id", raw.get("eos_token_id")))
        if eos is None:
            eos = vocab.get("<|endoftext|>")
        if eos is None:
            raise CheckpointFormatError(f"{path}: no eos_token_id in generation_config.json or config.json", path=path)
        pad = gen.get("pad_token_id", text_raw.get("pad_token_id"))
        languages = {m.group(1): i for token, i in vocab.items() if (m := _LANGUAGE_TAG.match(token))}
        return SpeechLlmPrompt(audio_token_id=int(raw.get("audio_token_index", raw.get("audio_token_id",
                                                                                        vocab.get(_AUDIO, 151646)))),
                               audio_bos_id=vocab[_BOS], audio_eos_id=vocab[_EOS], eos_token_ids=eos,
                               pad_token_id=None if pad is None else int(pad), languages=languages)

    def tokenizer_spec(self, path: Path, config: SpeechLlmConfig) -> TokenizerSpec:
        p = config.prompt
        return TokenizerSpec(kind="huggingface", files={"tokenizer": str(Path(path) / "tokenizer.json")},
                             special_ids=tuple(sorted({p.audio_token_id, p.audio_bos_id, p.audio_eos_id,
                                                       *p.eos_token_ids})))

    def feature_spec(self, path: Path, config: SpeechLlmConfig) -> FeatureSpec:
        pre_path = Path(path) / "preprocessor_config.json"
        pre = json.loads(pre_path.read_text(encoding="utf-8")) if pre_path.is_file() else {}
        bins = int(pre.get("feature_size", config.audio.num_mel_bins))
        if bins != config.audio.num_mel_bins:
            raise CheckpointFormatError(f"{pre_path}: feature_size {bins}, but the audio tower reads "
                                        f"{config.audio.num_mel_bins} mel bins", path=pre_path)
        return FeatureSpec(kind="whisper_logmel", sample_rate=16000, num_mel_bins=bins, frame_length_ms=25.0,
                           frame_shift_ms=10.0, window_type="hann", snip_edges=False, low_freq=0.0, high_freq=8000.0,
                           window_seconds=WINDOW_SECONDS, audio_scale=1.0)

    def decoding_defaults(self, path: Path, config: SpeechLlmConfig) -> DecodingDefaults:
        return DecodingDefaults(decode_type="llm", eos_id=config.prompt.eos_token_ids[0])
