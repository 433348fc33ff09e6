"""WeNet release directory → ``conformer`` model: :class:`WenetConverter`.

A WeNet directory is ``train.yaml`` + ``final.pt`` (a plain state dict) + ``units.txt`` (+
``global_cmvn``).  What this Conformer implements is stated by the tables below, not by code paths:
an ``encoder_conf`` key is either a config field, a training-only knob, or a value check, and a key
in none of them is refused, as is any refused value, with :class:`UnsupportedConfigError` naming the
key.  A ``decoder_conf`` the decoder cannot build drops the attention branch (CTC still works) with
a warning naming the key, and the registry's capability hint says what was lost.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

import torch
import yaml

from oasr.checkpoints import DETECT_NAMED_CONFIG, CheckpointConverter, extract_state_dict, load_torch_checkpoint
from oasr.errors import CheckpointFormatError, UnsupportedConfigError
from oasr.models import DecodingDefaults, FeatureSpec, TokenizerSpec
from oasr_models_wenet.config import (
    DECODER_ACTIVATIONS,
    ConformerEncoderConfig,
    ConformerModelConfig,
    TransformerDecoderConfig,
)

CONFIG_FILE = "train.yaml"
CHECKPOINT_FILES = ("final.pt",)
UNITS_FILES = ("units.txt", "words.txt")
CMVN_FILE = "global_cmvn"
CMVN_KEYS = ("encoder.global_cmvn.mean", "encoder.global_cmvn.istd")

# -- model level ----------------------------------------------------------------------------------
#: top-level yaml value → what this converter builds (OASR decodes through the CTC head these train)
MODEL_ACCEPTED: dict[str, tuple[Any, tuple[Any, ...]]] = {
    # key: (default when absent, accepted values)
    "encoder": ("conformer", ("conformer",)),
    "model": ("asr_model", ("asr_model", "k2_model")),
    "ctc": ("ctc", ("ctc",)),
}

# -- encoder_conf ---------------------------------------------------------------------------------
#: encoder_conf keys copied unchanged into :class:`ConformerEncoderConfig`
ENCODER_FIELDS = (
    "output_size", "attention_heads", "linear_units", "num_blocks", "input_layer", "macaron_style",
    "use_cnn_module", "cnn_module_kernel", "cnn_module_norm", "conv_inner_factor", "causal", "activation_type",
    "query_bias", "key_bias", "value_bias", "conv_bias", "mlp_bias", "norm_eps", "conv_norm_eps", "final_norm",
    "use_dynamic_chunk", "use_dynamic_left_chunk",
)
#: encoder_conf keys with no effect on inference (dropout, training switches; WeNet's Conformer
#: ignores positionwise_conv_kernel_size; n_expert* only matter with mlp_type moe, refused below)
ENCODER_IGNORED = (
    "dropout_rate", "positional_dropout_rate", "attention_dropout_rate", "gradient_checkpointing", "use_sdpa",
    "positionwise_conv_kernel_size", "n_expert", "n_expert_activated",
)
#: encoder_conf keys checked together with another key (see :func:`encoder_config`)
ENCODER_CHECKED = ("static_chunk_size",)
#: encoder_conf values this Conformer implements: key → (accepted values, why others are refused)
ENCODER_ACCEPTED: dict[str, tuple[tuple[Any, ...], str]] = {
    "pos_enc_layer_type": (("rel_pos",), "only WeNet's rel_pos positional encoding is implemented"),
    "selfattention_layer_type": (("rel_selfattn",), "only WeNet's rel_selfattn attention is implemented"),
    "layer_norm_type": (("layer_norm",), "RMSNorm Conformers are not implemented"),
    "cnn_module_norm": (("batch_norm", "layer_norm"), "the convolution module norm must be batch_norm or layer_norm"),
    "activation_type": (("swish", "relu"), "WeNet's gelu is exact erf while the fused convolution-module "
                                           "activation is the tanh approximation; only swish and relu are built"),
    "input_layer": (("conv2d", "conv2d6", "conv2d8"), "only conv2d subsampling (÷4, ÷6, ÷8) is implemented"),
    "normalize_before": ((True,), "only pre-norm (normalize_before: true) Conformers are implemented"),
    "concat_after": ((False,), "concat_after attention outputs are not implemented"),
    "mlp_type": (("position_wise_feed_forward",), "only the position-wise feed-forward is implemented"),
    "n_kv_head": ((None,), "grouped/multi-query relative attention is not implemented"),
    "head_dim": ((None,), "a head_dim other than output_size / attention_heads is not implemented"),
}

# -- decoder_conf ---------------------------------------------------------------------------------
DECODER_TYPES = ("transformer", "bitransformer")
#: decoder_conf keys copied unchanged into :class:`TransformerDecoderConfig`
DECODER_FIELDS = (
    "attention_heads", "linear_units", "num_blocks", "r_num_blocks", "activation_type", "query_bias", "key_bias",
    "value_bias", "src_query_bias", "src_key_bias", "src_value_bias", "mlp_bias", "norm_eps",
)
DECODER_IGNORED = (
    "dropout_rate", "positional_dropout_rate", "self_attention_dropout_rate", "src_attention_dropout_rate",
    "gradient_checkpointing", "use_sdpa", "tie_word_embedding", "n_expert", "n_expert_activated",
)
DECODER_ACCEPTED: dict[str, tuple[Any, ...]] = {
    "input_layer": ("embed",),
    "use_output_layer": (True,),
    "normalize_before": (True,),
    "src_attention": (True,),
    "layer_norm_type": ("layer_norm",),
    "mlp_type": ("position_wise_feed_forward",),
    "n_kv_head": (None,),
    "head_dim": (None,),
    "activation_type": DECODER_ACTIVATIONS,
}
#: model_conf values the rescoring branch supports (it does not filter blank frames)
MODEL_CONF_DECODER_ACCEPTED: dict[str, tuple[Any, ...]] = {"apply_non_blank_embedding": (False,)}

AED_HINT = ("the attention decoder (decoder.*) was not built, so the checkpoint serves CTC only and loses "
            "decode method 'ctc_aed_rescoring'")

DEFAULT_BEAM = 10
#: WeNet runtime's default CTC weight in attention rescoring
DEFAULT_RESCORING_CTC_WEIGHT = 0.5


def _refuse(path: Path, key: str, value: Any, why: str) -> UnsupportedConfigError:
    return UnsupportedConfigError(
        f"{path / CONFIG_FILE}: {key}: {value!r} is not supported by the OASR conformer ({why})",
        path=path / CONFIG_FILE, key=key)


def read_train_yaml(path: Path) -> dict[str, Any]:
    file = path / CONFIG_FILE
    try:
        data = yaml.safe_load(file.read_text())
    except FileNotFoundError:
        raise CheckpointFormatError(f"{file} does not exist; a WeNet directory needs it", path=file) from None
    except yaml.YAMLError as exc:
        raise CheckpointFormatError(f"{file} is not valid YAML: {exc}", path=file) from exc
    if not isinstance(data, dict):
        raise CheckpointFormatError(f"{file} must hold a mapping, found {type(data).__name__}", path=file)
    return data


def _required_int(path: Path, conf: dict[str, Any], key: str) -> int:
    value = conf.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise CheckpointFormatError(f"{path / CONFIG_FILE}: {key} must be a positive integer, found {value!r}",
                                    path=path / CONFIG_FILE)
    return value


def check_model(path: Path, conf: dict[str, Any]) -> None:
    """Refuse a model class, encoder class or CTC setup this converter does not build."""
    for key, (default, accepted) in MODEL_ACCEPTED.items():
        value = conf.get(key, default)
        if value not in accepted:
            raise _refuse(path, key, value, f"OASR builds {key} in {', '.join(map(str, accepted))}")
    ctc_weight = (conf.get("model_conf") or {}).get("ctc_weight", 0.5)
    if not ctc_weight:
        raise _refuse(path, "model_conf.ctc_weight", ctc_weight,
                      "a model trained without a CTC loss has an untrained CTC head, which OASR decodes through")


def encoder_config(path: Path, conf: dict[str, Any], has_cmvn: bool) -> ConformerEncoderConfig:
    """``encoder_conf`` → :class:`ConformerEncoderConfig`, refusing what is not implemented."""
    enc = conf.get("encoder_conf") or {}
    if not isinstance(enc, dict):
        raise CheckpointFormatError(f"{path / CONFIG_FILE}: encoder_conf must be a mapping", path=path / CONFIG_FILE)
    for key, value in enc.items():
        if key in ENCODER_ACCEPTED:
            accepted, why = ENCODER_ACCEPTED[key]
            if value not in accepted:
                raise _refuse(path, f"encoder_conf.{key}", value, why)
        elif key not in ENCODER_FIELDS + ENCODER_IGNORED + ENCODER_CHECKED:
            raise _refuse(path, f"encoder_conf.{key}", value, "an encoder_conf key this Conformer does not know")
    if (enc.get("static_chunk_size") or 0) > 0 and not enc.get("use_dynamic_chunk", False):
        raise _refuse(path, "encoder_conf.static_chunk_size", enc["static_chunk_size"],
                      "a static-chunk model without use_dynamic_chunk has chunk-masked attention even offline, "
                      "which is not implemented")
    fields = {key: enc[key] for key in ENCODER_FIELDS if key in enc}
    return ConformerEncoderConfig(input_dim=_required_int(path, conf, "input_dim"), global_cmvn=has_cmvn, **fields)


def decoder_config(path: Path, conf: dict[str, Any], vocab_size: int, d_model: int,
                   sos: int, eos: int) -> TransformerDecoderConfig | None:
    """``decoder``/``decoder_conf`` → config, or None (with a warning naming the key) when unbuildable."""
    if "decoder" in conf and conf["decoder"] is None:
        return None
    kind = conf.get("decoder", "bitransformer")

    def drop(key: str, value: Any) -> None:
        warnings.warn(f"{path / CONFIG_FILE}: {key}: {value!r} cannot be built; {AED_HINT}", RuntimeWarning,
                      stacklevel=4)

    if kind not in DECODER_TYPES:
        drop("decoder", kind)
        return None
    model_conf = conf.get("model_conf") or {}
    for key, accepted in MODEL_CONF_DECODER_ACCEPTED.items():
        if model_conf.get(key, accepted[0]) not in accepted:
            drop(f"model_conf.{key}", model_conf[key])
            return None
    dec = conf.get("decoder_conf") or {}
    for key, value in dec.items():
        if key in DECODER_ACCEPTED:
            if value not in DECODER_ACCEPTED[key]:
                drop(f"decoder_conf.{key}", value)
                return None
        elif key not in DECODER_FIELDS and key not in DECODER_IGNORED:
            drop(f"decoder_conf.{key}", value)
            return None
    fields = {key: dec[key] for key in DECODER_FIELDS if key in dec}
    return TransformerDecoderConfig(
        vocab_size=vocab_size, d_model=d_model, bidirectional=kind == "bitransformer", sos_id=sos, eos_id=eos,
        reverse_weight=float(model_conf.get("reverse_weight", 0.0)), **fields)


def special_tokens(conf: dict[str, Any], vocab_size: int) -> tuple[int, int]:
    """(sos, eos): ``tokenizer_conf.special_tokens`` when present, else vocab − 1 (WeNet's rule)."""
    specials = (conf.get("tokenizer_conf") or {}).get("special_tokens") or {}
    return int(specials.get("<sos>", vocab_size - 1)), int(specials.get("<eos>", vocab_size - 1))


def _cmvn_from_stats(means: list[float], sq_sums: list[float], count: float) -> tuple[torch.Tensor, torch.Tensor]:
    mean, istd = [], []
    for m, s in zip(means, sq_sums, strict=True):
        mu = m / count
        var = max(s / count - mu * mu, 1.0e-20)
        mean.append(mu)
        istd.append(1.0 / math.sqrt(var))
    return torch.tensor(mean, dtype=torch.float32), torch.tensor(istd, dtype=torch.float32)


def read_cmvn(file: Path, is_json: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """WeNet's global CMVN stats (JSON ``mean_stat``/``var_stat``/``frame_num``, or Kaldi text) →
    (mean, istd), float32."""
    raw = file.read_bytes()
    if raw[:2] == b"\0B":
        raise CheckpointFormatError(f"{file} is a binary Kaldi CMVN file; re-create it with "
                                    f"compute-cmvn-stats --binary=false", path=file)
    text = raw.decode("utf-8", errors="replace")
    if is_json is None:
        is_json = text.lstrip().startswith("{")
    try:
        if is_json:
            stats = json.loads(text)
            return _cmvn_from_stats(stats["mean_stat"], stats["var_stat"], float(stats["frame_num"]))
        tokens = text.split()
        if tokens[0] != "[" or tokens[-1] != "]" or tokens[-2] not in ("0", "0.0"):
            raise ValueError("expected '[ sums... count sq_sums... 0 ]'")
        dim = (len(tokens) - 4) // 2
        values = [float(t) for t in tokens[1:-1]]
        return _cmvn_from_stats(values[:dim], values[dim + 1:2 * dim + 1], values[dim])
    except (KeyError, ValueError, IndexError, TypeError, json.JSONDecodeError) as exc:
        kind = "JSON" if is_json else "Kaldi text"
        raise CheckpointFormatError(f"{file} is not a WeNet global CMVN file ({kind}): {exc}", path=file) from exc


class WenetConverter(CheckpointConverter):
    """WeNet U2/U2++ directories (``train.yaml`` + ``final.pt``) → ``conformer``."""

    architecture = "conformer"
    detect_specificity = DETECT_NAMED_CONFIG
    capability_drop_hints = {"decoder.": AED_HINT}

    def __init__(self, checkpoint_name: str | None = None):
        self.checkpoint_name = checkpoint_name
        self._yaml: dict[Path, dict[str, Any]] = {}

    def detect(self, path: Path) -> bool:
        return (Path(path) / CONFIG_FILE).is_file()

    def _conf(self, path: Path) -> dict[str, Any]:
        if path not in self._yaml:
            self._yaml[path] = read_train_yaml(path)
        return self._yaml[path]

    def checkpoint_file(self, path: Path) -> Path:
        """``checkpoint_name`` if given, else ``final.pt``, else the directory's only ``*.pt``."""
        if self.checkpoint_name is not None:
            file = (path / self.checkpoint_name).resolve()
            if not file.is_relative_to(path.resolve()):
                raise CheckpointFormatError(f"checkpoint {self.checkpoint_name!r} is outside {path}", path=path)
            return file
        for name in CHECKPOINT_FILES:
            if (path / name).is_file():
                return path / name
        candidates = sorted(p.name for p in path.glob("*.pt"))
        if len(candidates) == 1:
            return path / candidates[0]
        raise CheckpointFormatError(
            f"{path}: no final.pt, and {'several' if candidates else 'no'} other *.pt files "
            f"({', '.join(candidates) or 'none'}); name the checkpoint with WenetConverter(checkpoint_name=...)",
            path=path)

    def load_state_dict(self, path: Path) -> dict[str, torch.Tensor]:
        file = self.checkpoint_file(path)
        state = extract_state_dict(load_torch_checkpoint(file), file)
        if not all(key in state for key in CMVN_KEYS):
            cmvn = self.cmvn_file(path)
            if cmvn is not None:
                conf = self._conf(path)
                is_json = (conf.get("cmvn_conf") or {}).get("is_json_cmvn", conf.get("is_json_cmvn"))
                state[CMVN_KEYS[0]], state[CMVN_KEYS[1]] = read_cmvn(cmvn, is_json)
        return state

    def cmvn_file(self, path: Path) -> Path | None:
        """The CMVN stats file beside train.yaml, if the config declares global CMVN."""
        conf = self._conf(path)
        declared = (conf.get("cmvn_conf") or {}).get("cmvn_file") or conf.get("cmvn_file")
        if conf.get("cmvn", "global_cmvn" if declared else None) != "global_cmvn":
            return None
        names = [CMVN_FILE] + ([Path(declared).name] if declared else [])
        for name in names:
            if (path / name).is_file():
                return path / name
        raise CheckpointFormatError(
            f"{path / CONFIG_FILE} declares global CMVN but neither the checkpoint ({CMVN_KEYS[0]}) nor "
            f"{' / '.join(names)} in {path} provides it", path=path)

    def build_config(self, path: Path, state_dict: dict[str, torch.Tensor]) -> ConformerModelConfig:
        conf = self._conf(path)
        check_model(path, conf)
        has_cmvn = all(key in state_dict for key in CMVN_KEYS)
        encoder = encoder_config(path, conf, has_cmvn)
        vocab = _required_int(path, conf, "output_dim")
        sos, eos = special_tokens(conf, vocab)
        decoder = decoder_config(path, conf, vocab, encoder.output_size, sos, eos)
        blank = int((conf.get("ctc_conf") or {}).get("ctc_blank_id", 0))
        return ConformerModelConfig(vocab_size=vocab, encoder=encoder, decoder=decoder, blank_id=blank)

    def units_file(self, path: Path) -> Path:
        conf = self._conf(path)
        declared = (conf.get("tokenizer_conf") or {}).get("symbol_table_path")
        names = list(UNITS_FILES) + ([Path(declared).name] if declared else [])
        for name in names:
            if (path / name).is_file():
                return (path / name).resolve()
        raise CheckpointFormatError(f"{path}: no symbol table ({' / '.join(names)}) beside {CONFIG_FILE}", path=path)

    def tokenizer_spec(self, path: Path, config: ConformerModelConfig) -> TokenizerSpec:
        specials = {config.blank_id}
        if config.decoder is not None:
            specials |= {config.decoder.sos_id, config.decoder.eos_id}
        else:
            specials |= set(special_tokens(self._conf(path), config.vocab_size))
        return TokenizerSpec(kind="symbol_table", files={"units": str(self.units_file(path))},
                             special_ids=tuple(sorted(specials)))

    def feature_spec(self, path: Path, config: ConformerModelConfig) -> FeatureSpec:
        conf = self._conf(path)
        dataset = conf.get("dataset_conf") or {}
        kind = dataset.get("feats_type", "fbank")
        if kind not in ("fbank", "mfcc"):
            raise _refuse(path, "dataset_conf.feats_type", kind, "the Conformer is fed Kaldi fbank or mfcc features")
        legacy = ((conf.get("collate_conf") or {}).get("feature_extraction_conf")) or {}
        frame = dataset.get(f"{kind}_conf") or {}
        # WeNet's compute_mfcc defaults to 23 mel bins; an fbank model's bins are its input_dim
        bins = frame.get("num_mel_bins", legacy.get("mel_bins", 23 if kind == "mfcc" else config.encoder.input_dim))
        if kind == "mfcc":
            if frame.get("num_ceps", 40) != config.encoder.input_dim:
                raise CheckpointFormatError(f"{path / CONFIG_FILE}: dataset_conf.mfcc_conf.num_ceps does not match "
                                            f"input_dim {config.encoder.input_dim}", path=path / CONFIG_FILE)
        elif bins != config.encoder.input_dim:
            raise CheckpointFormatError(
                f"{path / CONFIG_FILE}: dataset_conf.fbank_conf.num_mel_bins is {bins} but input_dim is "
                f"{config.encoder.input_dim}", path=path / CONFIG_FILE)
        return FeatureSpec(
            kind="kaldi_fbank" if kind == "fbank" else "kaldi_mfcc",
            sample_rate=int((dataset.get("resample_conf") or {}).get("resample_rate", 16000)),
            num_mel_bins=int(bins),
            frame_length_ms=float(frame.get("frame_length", legacy.get("frame_length", 25))),
            frame_shift_ms=float(frame.get("frame_shift", legacy.get("frame_shift", 10))),
            dither=0.0,  # published train.yaml files carry the training dither
            window_type=str(frame.get("window_type", "povey")),
            snip_edges=True,
            low_freq=float(frame.get("low_freq", 20.0)),
            high_freq=float(frame.get("high_freq", 0.0)),  # 0.0: Nyquist (Kaldi convention)
            num_ceps=int(frame.get("num_ceps", 40)) if kind == "mfcc" else 13,
            audio_scale=32768.0,
        )

    def decoding_defaults(self, path: Path, config: ConformerModelConfig) -> DecodingDefaults:
        sos, eos = special_tokens(self._conf(path), config.vocab_size)
        options: dict[str, Any] = {"beam_size": DEFAULT_BEAM}
        if config.decoder is not None:
            options.update(ctc_weight=DEFAULT_RESCORING_CTC_WEIGHT, reverse_weight=config.decoder.reverse_weight)
        return DecodingDefaults(decode_type="ctc", blank_id=config.blank_id, sos_id=sos, eos_id=eos, options=options)
