"""Converters of the FastConformer family's Hugging Face layouts (Parakeet CTC, RNN-T, TDT).

A directory is claimed when its ``config.json`` says ``model_type`` ``"parakeet_ctc"``, ``"parakeet_rnnt"``
or ``"parakeet_tdt"`` (specificity 30).  It brings ``config.json`` (the head's config with a nested
``encoder_config``; omitted fields take transformers' defaults, which the OASR configs' defaults are),
weights in ``model.safetensors`` (or shards, or ``pytorch_model.bin`` read as data only), the feature
extractor's settings — ``processor_config.json``'s ``feature_extractor`` (transformers 5) or
``preprocessor_config.json`` — and ``tokenizer.json``.

The frontend is NeMo's log-mel (``nemotron_logmel``) followed by per-feature normalization, as
transformers' ``ParakeetFeatureExtractor`` computes it.  The blank is a token of its own: for CTC the
config's ``pad_token_id`` (transformers' CTC blank), for the transducers ``blank_token_id``; it never
reaches the text, nor do the tokenizer's own special pieces (``<unk>``, ``<pad>``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from oasr.checkpoints.converter import DETECT_KEYED_VALUE, CheckpointConverter
from oasr.errors import CheckpointFormatError, UnsupportedConfigError
from oasr.models.specs import DecodingDefaults, FeatureSpec, TokenizerSpec
from oasr_models_hf.fastconformer.config import (
    FastConformerConfig,
    ParakeetCtcConfig,
    ParakeetRnntConfig,
    ParakeetTdtConfig,
)
from oasr_models_hf.lasr.convert import load_hf_weights, model_type, read_json

_ENCODER_FIELDS = ("num_mel_bins", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                   "hidden_act", "attention_bias", "convolution_bias", "conv_kernel_size", "subsampling_factor",
                   "subsampling_conv_channels", "subsampling_conv_kernel_size", "subsampling_conv_stride",
                   "scale_input")


def encoder_fields(raw: dict[str, Any], path: Path) -> dict[str, Any]:
    """The encoder's fields from ``config.json``'s nested ``encoder_config`` (absent ones: defaults)."""
    enc = raw.get("encoder_config") or {}
    if not isinstance(enc, dict):
        raise CheckpointFormatError(f"{path}/config.json: encoder_config must be an object", path=path)
    heads = enc.get("num_attention_heads", 8)
    if enc.get("num_key_value_heads", heads) != heads:
        raise UnsupportedConfigError(f"{path}/config.json: FastConformer attention has as many key/value heads as "
                                     f"heads, got {enc['num_key_value_heads']} for {heads}", path=path,
                                     key="encoder_config.num_key_value_heads")
    return {k: enc[k] for k in _ENCODER_FIELDS if k in enc}


def feature_extractor_settings(path: Path) -> dict[str, Any]:
    """The feature extractor's saved settings, from either file transformers writes them to."""
    processor = path / "processor_config.json"
    if processor.is_file():
        nested = read_json(processor).get("feature_extractor")
        if isinstance(nested, dict):
            return nested
    legacy = path / "preprocessor_config.json"
    return read_json(legacy) if legacy.is_file() else {}


def nemo_feature_spec(path: Path, num_mel_bins: int) -> FeatureSpec:
    pre = feature_extractor_settings(path)
    rate = int(pre.get("sampling_rate", 16000))
    bins = int(pre.get("feature_size", num_mel_bins))
    if bins != num_mel_bins:
        raise CheckpointFormatError(f"{path}: the feature extractor has feature_size {bins}, the encoder reads "
                                    f"{num_mel_bins} mel bins", path=path)
    win, hop = int(pre.get("win_length", 400)), int(pre.get("hop_length", 160))
    preemphasis = pre.get("preemphasis", 0.97)
    return FeatureSpec(kind="nemotron_logmel", sample_rate=rate, num_mel_bins=bins,
                       frame_length_ms=1000.0 * win / rate, frame_shift_ms=1000.0 * hop / rate,
                       window_type="hann", snip_edges=False, low_freq=0.0, high_freq=rate / 2,
                       preemphasis=0.0 if preemphasis is None else float(preemphasis), normalize="per_feature",
                       audio_scale=1.0, options={"n_fft": int(pre.get("n_fft", 512))})


class _ParakeetConverter(CheckpointConverter):
    detect_specificity = DETECT_KEYED_VALUE
    hf_model_type: str = ""

    def detect(self, path: Path) -> bool:
        return model_type(Path(path)) == self.hf_model_type

    def load_state_dict(self, path: Path) -> dict[str, torch.Tensor]:
        return load_hf_weights(Path(path))

    def tokenizer_spec(self, path: Path, config: FastConformerConfig) -> TokenizerSpec:
        path = Path(path)
        if not (path / "tokenizer.json").is_file():
            raise CheckpointFormatError(f"{path} has no tokenizer.json: a Parakeet checkpoint needs its tokenizer "
                                        f"(save it with the processor's save_pretrained into the folder)", path=path)
        return TokenizerSpec(kind="huggingface", files={"tokenizer": str(path / "tokenizer.json")},
                             special_ids=(config.blank_id,))

    def feature_spec(self, path: Path, config: FastConformerConfig) -> FeatureSpec:
        return nemo_feature_spec(Path(path), config.num_mel_bins)


class ParakeetCtcConverter(_ParakeetConverter):
    """A Hugging Face ``parakeet_ctc`` directory."""

    architecture = "parakeet_ctc"
    hf_model_type = "parakeet_ctc"

    def build_config(self, path: Path, state_dict: dict[str, torch.Tensor]) -> ParakeetCtcConfig:
        path = Path(path)
        raw = read_json(path / "config.json")
        vocab = int(raw.get("vocab_size", 1025))
        blank = raw.get("pad_token_id", 1024)
        return ParakeetCtcConfig(vocab_size=vocab, blank_id=vocab - 1 if blank is None else int(blank),
                                 **encoder_fields(raw, path))

    def decoding_defaults(self, path: Path, config: ParakeetCtcConfig) -> DecodingDefaults:
        return DecodingDefaults(decode_type="ctc", blank_id=config.blank_id)


class ParakeetRnntConverter(_ParakeetConverter):
    """A Hugging Face ``parakeet_rnnt`` directory."""

    architecture = "parakeet_rnnt"
    hf_model_type = "parakeet_rnnt"
    config_class: type[ParakeetRnntConfig] = ParakeetRnntConfig

    def head_fields(self, raw: dict[str, Any]) -> dict[str, Any]:
        return {}

    def build_config(self, path: Path, state_dict: dict[str, torch.Tensor]) -> ParakeetRnntConfig:
        path = Path(path)
        raw = read_json(path / "config.json")
        fields = dict(encoder_fields(raw, path))
        for ours, theirs in (("vocab_size", "vocab_size"), ("blank_id", "blank_token_id"),
                             ("decoder_hidden_size", "decoder_hidden_size"),
                             ("num_decoder_layers", "num_decoder_layers"), ("joint_act", "hidden_act"),
                             ("max_symbols_per_step", "max_symbols_per_step")):
            if theirs in raw:
                fields[ours] = raw[theirs]
        return self.config_class(**fields, **self.head_fields(raw))

    def decoding_defaults(self, path: Path, config: ParakeetRnntConfig) -> DecodingDefaults:
        return DecodingDefaults(decode_type="transducer", blank_id=config.blank_id,
                                options={"max_symbols": config.max_symbols_per_step})


class ParakeetTdtConverter(ParakeetRnntConverter):
    """A Hugging Face ``parakeet_tdt`` directory."""

    architecture = "parakeet_tdt"
    hf_model_type = "parakeet_tdt"
    config_class = ParakeetTdtConfig

    def head_fields(self, raw: dict[str, Any]) -> dict[str, Any]:
        return {"tdt_durations": raw["durations"]} if "durations" in raw else {}
