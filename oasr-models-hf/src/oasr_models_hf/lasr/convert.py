"""The MedASR converter: a Hugging Face ``lasr_ctc`` directory becomes a ``lasr_ctc`` OASR model.

A directory is claimed when its ``config.json`` says ``model_type: "lasr_ctc"`` (specificity 30).  It
brings: ``config.json`` (the CTC config with a nested ``encoder_config``; omitted encoder fields take
transformers' ``LasrEncoderConfig`` defaults, which :class:`LasrConfig`'s defaults are), weights in
``model.safetensors``, sharded safetensors or ``pytorch_model.bin`` (data only),
``preprocessor_config.json`` (the frontend: bins, window, hop, FFT size; absent: the extractor's
defaults) and the tokenizer folder.

The tokenizer is read from the folder's files (``tokenizer.json``, else the SentencePiece
``spiece.model``), as ``LasrTokenizer.from_pretrained(folder)`` does; ids 0 (the CTC blank,
``<epsilon>``) and 1 to 3 (``<s>``, ``</s>``, ``<unk>``) never reach the text (seed 003: the head's
occasional final ``</s>`` would otherwise leak into the transcript).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from oasr.checkpoints.converter import DETECT_KEYED_VALUE, CheckpointConverter, load_torch_checkpoint
from oasr.errors import CheckpointFormatError, UnsupportedConfigError
from oasr.models.specs import DecodingDefaults, FeatureSpec, TokenizerSpec
from oasr_models_hf.lasr.config import LasrConfig
from oasr_models_hf.lasr.features import WINDOW

MODEL_TYPE = "lasr_ctc"
#: ids shown in no transcript: the blank and the SentencePiece control/unknown pieces
SPECIAL_IDS = (0, 1, 2, 3)
_ENCODER_FIELDS = ("num_mel_bins", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                   "hidden_act", "attention_bias", "convolution_bias", "conv_kernel_size", "subsampling_conv_channels",
                   "subsampling_conv_kernel_size", "subsampling_conv_stride", "layer_norm_eps",
                   "feed_forward_residual_weights", "conv_residual_weights")


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointFormatError(f"{path} does not exist", path=path) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointFormatError(f"{path} is not valid JSON: {exc}", path=path) from exc


def model_type(path: Path) -> str | None:
    """``config.json``'s ``model_type``, or None when there is no readable one."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return None
    try:
        raw = json.loads(config.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return raw.get("model_type") if isinstance(raw, dict) else None


def load_hf_weights(path: Path) -> dict[str, torch.Tensor]:
    """A Hugging Face directory's weights: ``model.safetensors``, its sharded index, or ``pytorch_model.bin``."""
    from safetensors.torch import load_file

    path = Path(path)
    single, index = path / "model.safetensors", path / "model.safetensors.index.json"
    if single.is_file():
        state = load_file(str(single))
    elif index.is_file():
        state = {}
        weight_map = read_json(index).get("weight_map", {})
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointFormatError(f"{index} has no weight_map", path=index)
        for shard in sorted(set(weight_map.values())):
            shard_path = (path / shard).resolve()
            if not shard_path.is_relative_to(path.resolve()):
                raise CheckpointFormatError(f"{index}: shard {shard!r} points outside {path}", path=index)
            if not shard_path.is_file():
                raise CheckpointFormatError(f"{index} names shard {shard!r}, which does not exist", path=index)
            state.update(load_file(str(shard_path)))
    elif (path / "pytorch_model.bin").is_file():
        state = load_torch_checkpoint(path / "pytorch_model.bin")
    else:
        raise CheckpointFormatError(f"{path} has no model.safetensors, model.safetensors.index.json or "
                                    f"pytorch_model.bin", path=path)
    return {k: v.float() if v.is_floating_point() else v for k, v in state.items()}


def rope_theta(raw: dict[str, Any], source: Path, default: float = 10000.0) -> float:
    """theta of a default (unscaled) RoPE, from 5.x ``rope_parameters`` or 4.x ``rope_theta``/``rope_scaling``."""
    params = raw.get("rope_parameters") or {}
    scaling = raw.get("rope_scaling") or {}
    kind = params.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
    if kind != "default":
        raise UnsupportedConfigError(f"{source}: rope_type {kind!r} is not supported (OASR builds the default RoPE)",
                                     path=source, key="rope_parameters")
    return float(params.get("rope_theta", raw.get("rope_theta", default)))


class LasrConverter(CheckpointConverter):
    """A Hugging Face MedASR / LASR-CTC directory."""

    architecture = "lasr_ctc"
    detect_specificity = DETECT_KEYED_VALUE

    def detect(self, path: Path) -> bool:
        return model_type(Path(path)) == MODEL_TYPE

    def load_state_dict(self, path: Path) -> dict[str, torch.Tensor]:
        return load_hf_weights(Path(path))

    def build_config(self, path: Path, state_dict: dict[str, torch.Tensor]) -> LasrConfig:
        path = Path(path)
        raw = read_json(path / "config.json")
        enc = raw.get("encoder_config") or {}
        if not isinstance(enc, dict):
            raise CheckpointFormatError(f"{path}/config.json: encoder_config must be an object", path=path)
        fields = {k: enc[k] for k in _ENCODER_FIELDS if k in enc}
        if enc.get("num_key_value_heads", fields.get("num_attention_heads", 8)) != fields.get("num_attention_heads", 8):
            raise UnsupportedConfigError(f"{path}/config.json: LASR attention has as many key/value heads as heads",
                                         path=path, key="encoder_config.num_key_value_heads")
        blank = raw.get("pad_token_id", 0)
        return LasrConfig(vocab_size=int(raw.get("vocab_size", 512)), rope_theta=rope_theta(enc, path),
                          blank_id=0 if blank is None else int(blank), **fields)

    def tokenizer_spec(self, path: Path, config: LasrConfig) -> TokenizerSpec:
        path = Path(path)
        specials = tuple(sorted(set(SPECIAL_IDS) | {config.blank_id}))
        if (path / "tokenizer.json").is_file():
            return TokenizerSpec(kind="huggingface", files={"tokenizer": str(path / "tokenizer.json")},
                                 special_ids=specials)
        if (path / "spiece.model").is_file():
            return TokenizerSpec(kind="sentencepiece", files={"model": str(path / "spiece.model")},
                                 special_ids=specials)
        raise CheckpointFormatError(f"{path} has neither tokenizer.json nor spiece.model: a LASR checkpoint needs its "
                                    f"tokenizer (save it with LasrTokenizer.save_pretrained into the folder)", path=path)

    def feature_spec(self, path: Path, config: LasrConfig) -> FeatureSpec:
        path = Path(path)
        pre = read_json(path / "preprocessor_config.json") if (path / "preprocessor_config.json").is_file() else {}
        rate = int(pre.get("sampling_rate", 16000))
        bins = int(pre.get("feature_size", config.num_mel_bins))
        if bins != config.num_mel_bins:
            raise CheckpointFormatError(f"{path}: preprocessor_config.json has feature_size {bins}, the encoder reads "
                                        f"{config.num_mel_bins} mel bins", path=path)
        win, hop = int(pre.get("win_length", 400)), int(pre.get("hop_length", 160))
        return FeatureSpec(kind="lasr_logmel", sample_rate=rate, num_mel_bins=bins,
                           frame_length_ms=1000.0 * win / rate, frame_shift_ms=1000.0 * hop / rate,
                           window_type=WINDOW, snip_edges=True, low_freq=125.0, high_freq=7500.0, preemphasis=0.0,
                           audio_scale=1.0, options={"n_fft": int(pre.get("n_fft", 512))})

    def decoding_defaults(self, path: Path, config: LasrConfig) -> DecodingDefaults:
        return DecodingDefaults(decode_type="ctc", blank_id=config.blank_id)
