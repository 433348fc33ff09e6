"""FunASR (ModelScope-style) directory → ``paraformer`` model: :class:`FunASRParaformerConverter`.

A FunASR directory is ``config.yaml`` + ``model.pt`` (a plain state dict) + ``tokens.json`` (or
``tokens.txt``) + ``am.mvn``; ``config.yaml``'s ``model:`` names the architecture, so detection is
keyed (specificity 30).  ``am.mvn`` (Kaldi nnet text: ``<AddShift>`` and ``<Rescale>`` rows over the
LFR dimension) becomes the encoder's ``cmvn_shift`` / ``cmvn_scale`` buffers, so the native bundle
carries it with the weights.

What is built is stated by the tables below: a component class outside them, or a value a table
refuses, is an :class:`UnsupportedConfigError` naming the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import yaml

from oasr.checkpoints import DETECT_KEYED_VALUE, CheckpointConverter, extract_state_dict, load_torch_checkpoint
from oasr.errors import CheckpointFormatError, UnsupportedConfigError
from oasr.models import DecodingDefaults, FeatureSpec, TokenizerSpec
from oasr_models_funasr.config import CifPredictorConfig, ParaformerConfig, SANMDecoderConfig, SANMEncoderConfig

CONFIG_FILE = "config.yaml"
CHECKPOINT_FILE = "model.pt"
CMVN_FILE = "am.mvn"
TOKEN_FILES = ("tokens.json", "tokens.txt")
CMVN_KEYS = ("encoder.cmvn_shift", "encoder.cmvn_scale")

#: config.yaml ``model:`` values this converter builds
MODELS = ("Paraformer", "BiCifParaformer")
#: component classes each model is built with: key → accepted values
COMPONENTS: dict[str, tuple[str, ...]] = {
    "encoder": ("SANMEncoder",),
    "decoder": ("ParaformerSANMDecoder",),
    "frontend": ("WavFrontend", "wav_frontend"),
}
PREDICTORS = {"Paraformer": ("CifPredictorV2",), "BiCifParaformer": ("CifPredictorV3",)}

ENCODER_FIELDS = ("output_size", "attention_heads", "linear_units", "num_blocks", "kernel_size", "sanm_shfit")
ENCODER_ACCEPTED: dict[str, tuple[Any, ...]] = {
    "input_layer": ("pe",), "selfattention_layer_type": ("sanm",), "normalize_before": (True,),
    "concat_after": (False,), "positionwise_layer_type": ("linear",), "interctc_layer_idx": ([], None),
    "pos_enc_class": ("SinusoidalPositionEncoder",), "lora_list": (None,),
}
DECODER_FIELDS = ("attention_heads", "linear_units", "num_blocks", "att_layer_num", "kernel_size", "sanm_shfit")
DECODER_ACCEPTED: dict[str, tuple[Any, ...]] = {
    "input_layer": ("embed",), "use_output_layer": (True,), "normalize_before": (True,), "concat_after": (False,),
    "wo_input_layer": (False,), "lora_list": (None,),
}
PREDICTOR_FIELDS = ("idim", "l_order", "r_order", "threshold", "smooth_factor", "noise_threshold", "tail_threshold",
                    "tail_mask", "upsample_times", "upsample_type", "use_cif1_cnn", "smooth_factor2",
                    "noise_threshold2")
#: keys with no effect on inference (dropout, training switches, TF export names)
IGNORED = ("dropout_rate", "positional_dropout_rate", "attention_dropout_rate", "self_attention_dropout_rate",
           "src_attention_dropout_rate", "dropout", "positionwise_conv_kernel_size", "padding_idx",
           "tf2torch_tensor_name_prefix_torch", "tf2torch_tensor_name_prefix_tf", "lora_rank", "lora_alpha",
           "lora_dropout", "interctc_use_conditioning", "chunk_multiply_factor")


def _refuse(path: Path, key: str, value: Any, why: str) -> UnsupportedConfigError:
    return UnsupportedConfigError(f"{path / CONFIG_FILE}: {key}: {value!r} is not supported ({why})",
                                  path=path / CONFIG_FILE, key=key)


def read_config(path: Path) -> dict[str, Any]:
    file = path / CONFIG_FILE
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointFormatError(f"{file} does not exist; a FunASR directory needs it", path=file) from None
    except yaml.YAMLError as exc:
        raise CheckpointFormatError(f"{file} is not valid YAML: {exc}", path=file) from exc
    if not isinstance(data, dict):
        raise CheckpointFormatError(f"{file} must hold a mapping, found {type(data).__name__}", path=file)
    return data


def read_am_mvn(file: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """``am.mvn`` → (shift, scale) float32: the ``<LearnRateCoef> 0 [ ... ]`` rows after ``<AddShift>``
    and ``<Rescale>``."""
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise CheckpointFormatError(f"{file} does not exist; a Paraformer needs its CMVN stats", path=file) from None
    rows: dict[str, list[float]] = {}
    for i, line in enumerate(lines[:-1]):
        head = line.split()
        nxt = lines[i + 1].split()
        if head and head[0] in ("<AddShift>", "<Rescale>") and nxt and nxt[0] == "<LearnRateCoef>":
            try:
                rows[head[0]] = [float(v) for v in nxt[3:-1]]
            except ValueError as exc:
                raise CheckpointFormatError(f"{file}: the {head[0]} row is not numeric: {exc}", path=file) from exc
    missing = [k for k in ("<AddShift>", "<Rescale>") if k not in rows]
    if missing or len(rows["<AddShift>"]) != len(rows["<Rescale>"]):
        raise CheckpointFormatError(f"{file} is not a FunASR am.mvn (need <AddShift> and <Rescale> rows of equal "
                                    f"length; missing: {', '.join(missing) or 'none'})", path=file)
    return (torch.tensor(rows["<AddShift>"], dtype=torch.float32),
            torch.tensor(rows["<Rescale>"], dtype=torch.float32))


def _section(path: Path, conf: dict[str, Any], name: str, fields: tuple[str, ...],
             accepted: dict[str, tuple[Any, ...]]) -> dict[str, Any]:
    section = conf.get(f"{name}_conf") or {}
    if not isinstance(section, dict):
        raise CheckpointFormatError(f"{path / CONFIG_FILE}: {name}_conf must be a mapping", path=path / CONFIG_FILE)
    for key, value in section.items():
        if key in accepted:
            if value not in accepted[key]:
                raise _refuse(path, f"{name}_conf.{key}", value, f"OASR builds {accepted[key]!r}")
        elif key not in fields and key not in IGNORED:
            raise _refuse(path, f"{name}_conf.{key}", value, f"a {name}_conf key the OASR paraformer does not know")
    return {key: section[key] for key in fields if key in section}


def check_components(path: Path, conf: dict[str, Any]) -> str:
    model = conf.get("model")
    if model not in MODELS:
        raise _refuse(path, "model", model, f"this converter builds {', '.join(MODELS)}")
    for key, accepted in {**COMPONENTS, "predictor": PREDICTORS[model]}.items():
        if conf.get(key) not in accepted:
            raise _refuse(path, key, conf.get(key), f"{model} is built with {key} {' / '.join(accepted)}")
    return model


class FunASRParaformerConverter(CheckpointConverter):
    """FunASR Paraformer / BiCifParaformer directories → ``paraformer``."""

    architecture = "paraformer"
    detect_specificity = DETECT_KEYED_VALUE
    #: training-only branches: the decoder's input embedding (unused by NAR decoding), the CTC head
    expected_unused_prefixes = ("decoder.embed.", "ctc.")

    def __init__(self):
        self._yaml: dict[Path, dict[str, Any]] = {}

    def detect(self, path: Path) -> bool:
        file = Path(path) / CONFIG_FILE
        if not file.is_file():
            return False
        try:
            return read_config(Path(path)).get("model") in MODELS
        except CheckpointFormatError:
            return False

    def _conf(self, path: Path) -> dict[str, Any]:
        if path not in self._yaml:
            self._yaml[path] = read_config(path)
        return self._yaml[path]

    def load_state_dict(self, path: Path) -> dict[str, torch.Tensor]:
        file = path / CHECKPOINT_FILE
        state = extract_state_dict(load_torch_checkpoint(file), file, keys=("state_dict", "model_state_dict", "model"))
        if not all(key in state for key in CMVN_KEYS):
            state[CMVN_KEYS[0]], state[CMVN_KEYS[1]] = read_am_mvn(path / CMVN_FILE)
        return state

    def build_config(self, path: Path, state_dict: dict[str, torch.Tensor]) -> ParaformerConfig:
        conf = self._conf(path)
        model = check_components(path, conf)
        encoder = _section(path, conf, "encoder", ENCODER_FIELDS, ENCODER_ACCEPTED)
        decoder = _section(path, conf, "decoder", DECODER_FIELDS, DECODER_ACCEPTED)
        predictor = _section(path, conf, "predictor", PREDICTOR_FIELDS, {})
        if model == "Paraformer":
            for key in ("upsample_times", "upsample_type", "use_cif1_cnn", "smooth_factor2", "noise_threshold2"):
                predictor.pop(key, None)
        else:
            predictor.setdefault("upsample_times", 5)  # CifPredictorV3's defaults
            predictor.setdefault("upsample_type", "cnn")
        shift = state_dict[CMVN_KEYS[0]]
        input_size = int(shift.numel())
        output = self._output_size(path, state_dict)
        model_conf = conf.get("model_conf") or {}
        dec = SANMDecoderConfig(vocab_size=output, d_model=int(encoder.get("output_size", 256)),
                                **{"num_blocks": 6, "att_layer_num": 6, "kernel_size": 21, **decoder})
        if dec.sanm_shfit is None:
            dec.sanm_shfit = (dec.kernel_size - 1) // 2
        return ParaformerConfig(
            vocab_size=output,
            encoder=SANMEncoderConfig(input_size=input_size, **{"output_size": 256, "num_blocks": 6, **encoder}),
            decoder=dec,
            predictor=CifPredictorConfig(**predictor),
            blank_id=int(model_conf.get("blank_id", 0)),
            sos_id=int(model_conf.get("sos", 1)),
            eos_id=int(model_conf.get("eos", 2)),
        )

    @staticmethod
    def _output_size(path: Path, state_dict: dict[str, torch.Tensor]) -> int:
        weight = state_dict.get("decoder.output_layer.weight")
        if weight is None:
            raise CheckpointFormatError(f"{path / CHECKPOINT_FILE} has no decoder.output_layer.weight", path=path)
        return int(weight.shape[0])

    def token_file(self, path: Path) -> Path:
        for name in TOKEN_FILES:
            if (path / name).is_file():
                return (path / name).resolve()
        raise CheckpointFormatError(f"{path}: no token list ({' / '.join(TOKEN_FILES)}) beside {CONFIG_FILE}",
                                    path=path)

    def tokenizer_spec(self, path: Path, config: ParaformerConfig) -> TokenizerSpec:
        return TokenizerSpec(kind="funasr_char", files={"tokens": str(self.token_file(path))},
                             special_ids=tuple(sorted({config.blank_id, config.sos_id, config.eos_id})))

    def feature_spec(self, path: Path, config: ParaformerConfig) -> FeatureSpec:
        front = self._conf(path).get("frontend_conf") or {}
        lfr_m, lfr_n = int(front.get("lfr_m", 1)), int(front.get("lfr_n", 1))
        n_mels = int(front.get("n_mels", 80))
        if n_mels * lfr_m != config.encoder.input_size:
            raise CheckpointFormatError(
                f"{path / CONFIG_FILE}: frontend_conf n_mels {n_mels} x lfr_m {lfr_m} = {n_mels * lfr_m} but "
                f"{CMVN_FILE} has {config.encoder.input_size} values", path=path / CONFIG_FILE)
        return FeatureSpec(
            kind="kaldi_fbank",
            sample_rate=int(front.get("fs", 16000)),
            num_mel_bins=n_mels,
            frame_length_ms=float(front.get("frame_length", 25)),
            frame_shift_ms=float(front.get("frame_shift", 10)),
            # WavFrontend's dither (default 1.0) is a training augmentation; inference runs without it
            dither=0.0,
            window_type=str(front.get("window", "hamming")),
            snip_edges=bool(front.get("snip_edges", True)),
            lfr_m=lfr_m,
            lfr_n=lfr_n,
            audio_scale=32768.0 if front.get("upsacle_samples", True) else 1.0,
        )

    def decoding_defaults(self, path: Path, config: ParaformerConfig) -> DecodingDefaults:
        return DecodingDefaults(decode_type="paraformer", blank_id=config.blank_id, sos_id=config.sos_id,
                                eos_id=config.eos_id)


# -- SenseVoice ----------------------------------------------------------------------------------
SENSEVOICE_MODELS = ("SenseVoiceSmall",)
SENSEVOICE_COMPONENTS: dict[str, tuple[str, ...]] = {
    "encoder": ("SenseVoiceEncoderSmall",), "frontend": ("WavFrontend", "wav_frontend"),
}
SENSEVOICE_ENCODER_FIELDS = ENCODER_FIELDS + ("tp_blocks",)
SENSEVOICE_ENCODER_IGNORED = ("stochastic_depth_rate",)
#: SenseVoice's LayerNorm is torch's, with torch's default epsilon
SENSEVOICE_NORM_EPS = 1e-5


class FunASRSenseVoiceConverter(FunASRParaformerConverter):
    """FunASR SenseVoice-Small directories (``config.yaml`` ``model: SenseVoiceSmall``, a SentencePiece
    ``*.bpe.model``) → ``sensevoice``."""

    architecture = "sensevoice"
    expected_unused_prefixes = ()

    def detect(self, path: Path) -> bool:
        if not (Path(path) / CONFIG_FILE).is_file():
            return False
        try:
            return read_config(Path(path)).get("model") in SENSEVOICE_MODELS
        except CheckpointFormatError:
            return False

    def build_config(self, path: Path, state_dict: dict[str, torch.Tensor]):
        from oasr_models_funasr.config import SenseVoiceConfig

        conf = self._conf(path)
        if conf.get("model") not in SENSEVOICE_MODELS:
            raise _refuse(path, "model", conf.get("model"), f"this converter builds {', '.join(SENSEVOICE_MODELS)}")
        for key, accepted in SENSEVOICE_COMPONENTS.items():
            if conf.get(key) not in accepted:
                raise _refuse(path, key, conf.get(key), f"SenseVoice is built with {key} {' / '.join(accepted)}")
        encoder = _section(path, {"encoder_conf": {k: v for k, v in (conf.get("encoder_conf") or {}).items()
                                                   if k not in SENSEVOICE_ENCODER_IGNORED}},
                           "encoder", SENSEVOICE_ENCODER_FIELDS, ENCODER_ACCEPTED)
        for key in ("ctc.ctc_lo.weight", "embed.weight"):
            if key not in state_dict:
                raise CheckpointFormatError(f"{path / CHECKPOINT_FILE} has no {key}", path=path)
        model_conf = conf.get("model_conf") or {}
        return SenseVoiceConfig(
            vocab_size=int(state_dict["ctc.ctc_lo.weight"].shape[0]),
            encoder=SANMEncoderConfig(input_size=int(state_dict[CMVN_KEYS[0]].numel()), tp_norm=True,
                                      norm_eps=SENSEVOICE_NORM_EPS,
                                      **{"output_size": 256, "num_blocks": 6, **encoder}),
            blank_id=int(model_conf.get("blank_id", 0)),
            num_queries=int(state_dict["embed.weight"].shape[0]),
        )

    def bpe_file(self, path: Path) -> Path:
        declared = (self._conf(path).get("tokenizer_conf") or {}).get("bpemodel")
        names = ([Path(str(declared)).name] if declared else []) + sorted(p.name for p in path.glob("*bpe.model"))
        for name in names:
            if (path / name).is_file():
                return (path / name).resolve()
        raise CheckpointFormatError(f"{path}: no SentencePiece model (tokenizer_conf.bpemodel or *.bpe.model)",
                                    path=path)

    def tokenizer_spec(self, path: Path, config) -> TokenizerSpec:
        import sentencepiece

        from oasr_models_funasr.sensevoice import TAG_CLASSES

        model = self.bpe_file(path)
        sp = sentencepiece.SentencePieceProcessor(model_file=str(model))
        tags = {f"<|{name}|>" for names in TAG_CLASSES.values() for name in names}
        tag_ids = {i for i in range(sp.get_piece_size()) if sp.id_to_piece(i) in tags}
        return TokenizerSpec(kind="sentencepiece", files={"model": str(model)},
                             special_ids=tuple(sorted({config.blank_id} | tag_ids)))

    def decoding_defaults(self, path: Path, config) -> DecodingDefaults:
        return DecodingDefaults(decode_type="sensevoice", blank_id=config.blank_id)
