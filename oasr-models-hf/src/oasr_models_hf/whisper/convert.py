"""Whisper checkpoint converters: Hugging Face directories and CTranslate2 (faster-whisper) directories.

Both layouts become the same thing: a Hugging Face-layout state dict (float tensors), a
:class:`WhisperConfig` with the generation-control ids, the ``whisper`` tokenizer spec over the
directory's ``tokenizer.json`` and the ``whisper_logmel`` feature spec.

* Hugging Face (:class:`HFWhisperConverter`): ``config.json`` with ``model_type: "whisper"``;
  weights in ``model.safetensors``, sharded safetensors (``model.safetensors.index.json``) or
  ``pytorch_model.bin`` (read as data only); ids from ``generation_config.json``, completed from the
  tokenizer's vocabulary.
* CTranslate2 (:class:`CT2WhisperConverter`): ``model.bin`` whose header names ``WhisperSpec``,
  beside ``config.json`` (suppress lists, language ids, alignment heads) and the vocabulary
  (``vocabulary.json`` or ``vocabulary.txt``).  The shapes give the config.  float32, float16,
  bfloat16, int8 (per-row scales) and int16 weights are read and dequantized to float32; fused
  projections are split back into q/k/v.

The registry holds one converter per architecture, so :class:`WhisperConverter` (registered for
``whisper``) recognizes both layouts and hands each to its converter.  Both markers name the
architecture (a ``model_type`` value, a spec name in the binary header): specificity 30.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import numpy as np
import torch

from oasr.checkpoints.converter import (
    DETECT_KEYED_VALUE,
    CheckpointConverter,
    ConvertedCheckpoint,
    load_torch_checkpoint,
)
from oasr.errors import CheckpointFormatError, UnsupportedConfigError
from oasr.models.specs import DecodingDefaults, FeatureSpec, TokenizerSpec
from oasr_models_hf.whisper.config import WINDOW_SECONDS, WhisperConfig, WhisperGeneration

#: the config.json fields that shape the network (everything else there is training or HF plumbing)
_SHAPE_FIELDS = ("vocab_size", "num_mel_bins", "d_model", "encoder_layers", "encoder_attention_heads",
                 "encoder_ffn_dim", "decoder_layers", "decoder_attention_heads", "decoder_ffn_dim",
                 "max_source_positions", "max_target_positions", "activation_function", "scale_embedding")

# Vocabulary strings of the generation-control tokens.
_EOT, _SOT, _SOT_PREV, _SOT_LM = "<|endoftext|>", "<|startoftranscript|>", "<|startofprev|>", "<|startoflm|>"
_NO_TIMESTAMPS, _TRANSCRIBE, _TRANSLATE = "<|notimestamps|>", "<|transcribe|>", "<|translate|>"
_NO_SPEECH = ("<|nospeech|>", "<|nocaptions|>")
_NON_LANGUAGE = {_EOT, _SOT, _SOT_PREV, _SOT_LM, _NO_TIMESTAMPS, _TRANSCRIBE, _TRANSLATE, *_NO_SPEECH}
#: OpenAI's multilingual vocabularies have 51,865 ids (51,866 for 100 languages); English-only ones 51,864
_MULTILINGUAL_VOCAB = 51865


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointFormatError(f"{path} does not exist", path=path) from None
    except json.JSONDecodeError as exc:
        raise CheckpointFormatError(f"{path} is not valid JSON: {exc}", path=path) from exc


def _language_code(token: str) -> str | None:
    """``"<|en|>"`` → ``"en"``; None for a token that is not a language token."""
    if token in _NON_LANGUAGE or not (token.startswith("<|") and token.endswith("|>")):
        return None
    code = token[2:-2]
    return code if code.isalpha() and code.islower() and len(code) <= 3 else None


def _tokenizer_vocab(path: Path) -> dict[str, int]:
    """Token string → id from a ``tokenizer.json`` (model vocabulary plus added tokens)."""
    data = _read_json(path)
    vocab = dict(data.get("model", {}).get("vocab", {}) or {})
    for added in data.get("added_tokens", []):
        vocab[added["content"]] = int(added["id"])
    return vocab


def _tokenizer_spec(root: Path) -> TokenizerSpec:
    tokenizer = root / "tokenizer.json"
    if not tokenizer.is_file():
        raise CheckpointFormatError(
            f"{root} has no tokenizer.json: a Whisper checkpoint needs its tokenizer (save it with "
            f"WhisperTokenizerFast.save_pretrained, or copy it into a CTranslate2 directory with "
            f"--copy_files tokenizer.json)", path=root)
    return TokenizerSpec(kind="whisper", files={"tokenizer": str(tokenizer)})


def _feature_spec(config: WhisperConfig) -> FeatureSpec:
    return FeatureSpec(kind="whisper_logmel", sample_rate=16000, num_mel_bins=config.num_mel_bins,
                       frame_length_ms=25.0, frame_shift_ms=10.0, window_type="hann", snip_edges=False,
                       low_freq=0.0, high_freq=8000.0, window_seconds=float(WINDOW_SECONDS), audio_scale=1.0)


def _decoding_defaults(config: WhisperConfig) -> DecodingDefaults:
    gen = config.generation
    # openai-whisper's transcribe() defaults: the temperature fallback schedule and its thresholds
    return DecodingDefaults(decode_type="aed", sos_id=gen.sot_id, eos_id=gen.eot_id, options={
        "temperature_fallback": [0.0, 0.2, 0.4, 0.6, 0.8, 1.0], "compression_ratio_threshold": 2.4,
        "logprob_threshold": -1.0, "no_speech_threshold": 0.6, "condition_on_previous_text": True,
    })


def _default_alignment_heads(layers: int, heads: int) -> list[tuple[int, int]]:
    """All heads of the second half of the decoder (what CTranslate2 assumes when none are given)."""
    return [(layer, head) for layer in range(layers // 2, layers) for head in range(heads)]


def build_generation(vocab: dict[str, int], vocab_size: int, *, languages: dict[str, int] | None = None,
                     overrides: dict[str, Any] | None = None, source: Path) -> WhisperGeneration:
    """Generation ids from a vocabulary (token → id), with explicit ``overrides`` taking precedence."""
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}

    def need(token: str) -> int:
        if token not in vocab:
            raise CheckpointFormatError(f"{source}: the vocabulary has no {token} token; this is not a Whisper "
                                        f"vocabulary", path=source)
        return vocab[token]

    no_speech = next((vocab[t] for t in _NO_SPEECH if t in vocab), None)
    if languages is None:
        languages = {}
        if vocab_size >= _MULTILINGUAL_VOCAB:
            languages = {code: i for token, i in vocab.items() if (code := _language_code(token)) is not None}
    fields: dict[str, Any] = dict(
        eot_id=need(_EOT), sot_id=need(_SOT), no_timestamps_id=need(_NO_TIMESTAMPS),
        sot_prev_id=vocab.get(_SOT_PREV), sot_lm_id=vocab.get(_SOT_LM), no_speech_id=no_speech,
        transcribe_id=vocab.get(_TRANSCRIBE), translate_id=vocab.get(_TRANSLATE), languages=languages,
        begin_suppress_tokens=(vocab.get("Ġ", 220), need(_EOT)),
    )
    fields.update(overrides)
    return WhisperGeneration(**fields)


class _WhisperLayout(CheckpointConverter):
    """What both Whisper layouts emit besides the weights: the tokenizer, features and decoding defaults."""

    architecture = "whisper"

    def tokenizer_spec(self, path: Path, config: WhisperConfig) -> TokenizerSpec:
        return _tokenizer_spec(Path(path))

    def feature_spec(self, path: Path, config: WhisperConfig) -> FeatureSpec:
        return _feature_spec(config)

    def decoding_defaults(self, path: Path, config: WhisperConfig) -> DecodingDefaults:
        return _decoding_defaults(config)


class HFWhisperConverter(_WhisperLayout):
    """A Hugging Face Whisper directory (``config.json`` with ``model_type: "whisper"``)."""

    detect_specificity = DETECT_KEYED_VALUE
    # The output projection is tied to the token embedding; a checkpoint may store it anyway.
    expected_unused_prefixes = ("proj_out.",)

    def detect(self, path: Path) -> bool:
        config = Path(path) / "config.json"
        if not config.is_file():
            return False
        try:
            return json.loads(config.read_text(encoding="utf-8")).get("model_type") == "whisper"
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
            return False

    def load_state_dict(self, path: Path) -> dict[str, torch.Tensor]:
        from oasr.checkpoints.files import load_safetensors, resolve_inside

        path = Path(path)
        single = path / "model.safetensors"
        index = path / "model.safetensors.index.json"
        if single.is_file():
            state = load_safetensors(single)
        elif index.is_file():
            state = {}
            for shard in sorted(set(_read_json(index).get("weight_map", {}).values())):
                state.update(load_safetensors(resolve_inside(path, shard)))  # hub snapshots link into blobs/
        elif (path / "pytorch_model.bin").is_file():
            state = load_torch_checkpoint(path / "pytorch_model.bin")
        else:
            raise CheckpointFormatError(f"{path} has no model.safetensors, model.safetensors.index.json or "
                                        f"pytorch_model.bin", path=path)
        return {k: v.float() if v.is_floating_point() else v for k, v in state.items()}

    def build_config(self, path: Path, state_dict: dict[str, torch.Tensor]) -> WhisperConfig:
        path = Path(path)
        raw = _read_json(path / "config.json")
        shape = {k: raw[k] for k in _SHAPE_FIELDS if k in raw}
        if raw.get("activation_function", "gelu") != "gelu":
            raise UnsupportedConfigError(f"{path}/config.json: activation_function "
                                         f"{raw['activation_function']!r} (OASR's Whisper builds 'gelu')",
                                         path=path, key="activation_function")
        if raw.get("scale_embedding"):
            raise UnsupportedConfigError(f"{path}/config.json: scale_embedding true is not a Whisper setting",
                                         path=path, key="scale_embedding")
        gen_path = path / "generation_config.json"
        gen = _read_json(gen_path) if gen_path.is_file() else {}
        vocab = _tokenizer_vocab(path / "tokenizer.json") if (path / "tokenizer.json").is_file() else {}
        vocab_size = int(raw.get("vocab_size", 51865))
        languages = None
        if "lang_to_id" in gen and gen.get("is_multilingual", True):
            languages = {tok[2:-2]: int(i) for tok, i in gen["lang_to_id"].items()}
        elif "is_multilingual" in gen and not gen["is_multilingual"]:
            languages = {}
        task = gen.get("task_to_id", {})
        heads = gen.get("alignment_heads") or _default_alignment_heads(
            int(raw.get("decoder_layers", 4)), int(raw.get("decoder_attention_heads", 6)))
        overrides = {
            "eot_id": _first(gen.get("eos_token_id", raw.get("eos_token_id"))),
            "sot_id": gen.get("decoder_start_token_id", raw.get("decoder_start_token_id")),
            "no_timestamps_id": gen.get("no_timestamps_token_id"),
            "sot_prev_id": gen.get("prev_sot_token_id"),
            "transcribe_id": task.get("transcribe"), "translate_id": task.get("translate"),
            "suppress_tokens": gen.get("suppress_tokens", raw.get("suppress_tokens")) or (),
            "begin_suppress_tokens": gen.get("begin_suppress_tokens", raw.get("begin_suppress_tokens")),
            "alignment_heads": heads,
            "max_initial_timestamp_index": gen.get("max_initial_timestamp_index", 50),
        }
        if not vocab:
            raise CheckpointFormatError(f"{path} has no tokenizer.json to read the Whisper special tokens from",
                                        path=path)
        generation = build_generation(vocab, vocab_size, languages=languages, overrides=overrides, source=path)
        return WhisperConfig(**shape, generation=generation)


def _first(value: Any) -> Any:
    return value[0] if isinstance(value, (list, tuple)) else value


# -- CTranslate2 --------------------------------------------------------------------------------------
#: DataType ids of CTranslate2's model.bin (include/ctranslate2/types.h) → numpy dtype
_CT2_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16, 5: None}  # 5: bfloat16
_CT2_SPEC = "WhisperSpec"


class _Reader:
    """Little-endian reads over a bytes buffer, with errors that name the file and offset."""

    def __init__(self, data: bytes, path: Path):
        self.data, self.pos, self.path = data, 0, path

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise CheckpointFormatError(f"{self.path} is truncated: needed {n} bytes at offset {self.pos}",
                                        path=self.path)
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str) -> int:
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        raw = self.take(self.unpack("H"))
        return raw.rstrip(b"\0").decode("utf-8")


def ct2_spec_name(path: Path) -> str | None:
    """The spec name in a ``model.bin`` header (binary version >= 2), or None if unreadable."""
    try:
        with open(path, "rb") as f:
            head = f.read(4 + 2 + 256)
        reader = _Reader(head, path)
        if reader.unpack("I") < 2:
            return None
        return reader.string()
    except (OSError, CheckpointFormatError, UnicodeDecodeError, struct.error):
        return None


def read_ct2_model(path: str | Path) -> tuple[str, int, dict[str, np.ndarray]]:
    """Read a CTranslate2 ``model.bin``: (spec name, spec revision, name → array), aliases resolved.

    Quantized weights are returned as stored; their ``<name>_scale`` sits beside them (an alias
    also aliases the scale).
    """
    path = Path(path)
    reader = _Reader(path.read_bytes(), path)
    version = reader.unpack("I")
    if version < 4 or version > 6:
        raise CheckpointFormatError(f"{path}: CTranslate2 binary version {version} is not supported (4 to 6 are)",
                                    path=path)
    spec, revision = reader.string(), reader.unpack("I")
    variables: dict[str, np.ndarray] = {}
    for _ in range(reader.unpack("I")):
        name = reader.string()
        shape = tuple(reader.unpack("I") for _ in range(reader.unpack("B")))
        type_id, nbytes = reader.unpack("B"), reader.unpack("I")
        raw = reader.take(nbytes)
        if type_id not in _CT2_DTYPES:
            raise CheckpointFormatError(f"{path}: variable {name!r} has unknown data type id {type_id}", path=path)
        if _CT2_DTYPES[type_id] is None:  # bfloat16: the high half of a float32
            array = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            array = np.frombuffer(raw, dtype=_CT2_DTYPES[type_id])
        if array.size != math.prod(shape):
            raise CheckpointFormatError(f"{path}: variable {name!r} has shape {shape} ({math.prod(shape)} values) "
                                        f"but {nbytes} bytes of data ({array.size} values); the file is corrupt",
                                        path=path)
        variables[name] = array.reshape(shape)
    for _ in range(reader.unpack("I")):
        alias, target = reader.string(), reader.string()
        if target in variables:
            variables[alias] = variables[target]
            if target + "_scale" in variables:
                variables[alias + "_scale"] = variables[target + "_scale"]
    return spec, revision, variables


def _dequantize(variables: dict[str, np.ndarray], name: str, path: Path) -> torch.Tensor:
    value = variables[name]
    if value.dtype in (np.int8, np.int16):
        scale = variables.get(name + "_scale")
        if scale is None:
            raise CheckpointFormatError(f"{path}: quantized variable {name!r} has no {name}_scale", path=path)
        flat = value.reshape(value.shape[0], -1).astype(np.float32)
        scale = np.asarray(scale, dtype=np.float32).reshape(-1, 1)  # per row (int8) or one scalar (int16)
        return torch.from_numpy((flat / scale).reshape(value.shape))
    return torch.from_numpy(value.astype(np.float32))


def _ct2_state_dict(variables: dict[str, np.ndarray], d: int, path: Path) -> dict[str, torch.Tensor]:
    """CTranslate2 Whisper variables → Hugging Face-layout tensors (fused projections split)."""
    get = lambda name: _dequantize(variables, name, path)  # noqa: E731
    has = variables.__contains__
    out: dict[str, torch.Tensor] = {}

    def norm(src: str, dst: str) -> None:
        out[f"{dst}.weight"], out[f"{dst}.bias"] = get(f"{src}/gamma"), get(f"{src}/beta")

    def linear(src: str, dst: str, bias: bool = True) -> None:
        out[f"{dst}.weight"] = get(f"{src}/weight")
        if bias:
            out[f"{dst}.bias"] = get(f"{src}/bias") if has(f"{src}/bias") else torch.zeros(out[f"{dst}.weight"].shape[0])

    def split(src: str, dsts: list[str]) -> None:
        weight = get(f"{src}/weight")
        bias = get(f"{src}/bias") if has(f"{src}/bias") else torch.zeros(weight.shape[0])
        for j, dst in enumerate(dsts):
            rows = slice(j * d, (j + 1) * d)
            out[f"{dst}.weight"] = weight[rows].clone()
            if dst.endswith("k_proj"):
                if bool(bias[rows].abs().max() > 0):
                    raise UnsupportedConfigError(f"{path}: {src} has a non-zero key bias; Whisper's k_proj has none",
                                                 path=path, key=src)
            else:
                out[f"{dst}.bias"] = bias[rows].clone()

    def layer_common(src: str, dst: str) -> None:
        norm(f"{src}/self_attention/layer_norm", f"{dst}.self_attn_layer_norm")
        split(f"{src}/self_attention/linear_0", [f"{dst}.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj")])
        linear(f"{src}/self_attention/linear_1", f"{dst}.self_attn.out_proj")
        norm(f"{src}/ffn/layer_norm", f"{dst}.final_layer_norm")
        linear(f"{src}/ffn/linear_0", f"{dst}.fc1")
        linear(f"{src}/ffn/linear_1", f"{dst}.fc2")

    for conv in ("conv1", "conv2"):
        linear(f"encoder/{conv}", f"encoder.{conv}")
    out["encoder.embed_positions.weight"] = get("encoder/position_encodings/encodings")
    norm("encoder/layer_norm", "encoder.layer_norm")
    for i in range(_count_layers(variables, "encoder")):
        layer_common(f"encoder/layer_{i}", f"encoder.layers.{i}")
    out["decoder.embed_tokens.weight"] = get("decoder/embeddings/weight")
    out["decoder.embed_positions.weight"] = get("decoder/position_encodings/encodings")
    norm("decoder/layer_norm", "decoder.layer_norm")
    for i in range(_count_layers(variables, "decoder")):
        src, dst = f"decoder/layer_{i}", f"decoder.layers.{i}"
        layer_common(src, dst)
        norm(f"{src}/attention/layer_norm", f"{dst}.encoder_attn_layer_norm")
        linear(f"{src}/attention/linear_0", f"{dst}.encoder_attn.q_proj")
        split(f"{src}/attention/linear_1", [f"{dst}.encoder_attn.k_proj", f"{dst}.encoder_attn.v_proj"])
        linear(f"{src}/attention/linear_2", f"{dst}.encoder_attn.out_proj")
    if has("decoder/projection/weight"):
        projection = get("decoder/projection/weight")
        if not torch.equal(projection, out["decoder.embed_tokens.weight"]):
            raise UnsupportedConfigError(f"{path}: the output projection is not tied to the token embedding",
                                         path=path, key="decoder/projection/weight")
    return out


def _count_layers(variables: dict[str, np.ndarray], prefix: str) -> int:
    n = 0
    while f"{prefix}/layer_{n}/ffn/linear_0/weight" in variables:
        n += 1
    return n


def _scalar(variables: dict[str, np.ndarray], name: str, default: int | None = None) -> int | None:
    value = variables.get(name)
    return default if value is None else int(np.asarray(value).reshape(-1)[0])


def _ct2_vocabulary(path: Path) -> list[str]:
    if (path / "vocabulary.json").is_file():
        tokens = _read_json(path / "vocabulary.json")
    elif (path / "vocabulary.txt").is_file():
        tokens = (path / "vocabulary.txt").read_text(encoding="utf-8").split("\n")
        if tokens and tokens[-1] == "":
            tokens.pop()
    else:
        raise CheckpointFormatError(f"{path} has no vocabulary.json or vocabulary.txt", path=path)
    if not isinstance(tokens, list):
        raise CheckpointFormatError(f"{path}: the vocabulary is not a list of tokens", path=path)
    return [str(t) for t in tokens]


class CT2WhisperConverter(_WhisperLayout):
    """A CTranslate2 Whisper directory (what faster-whisper loads)."""

    detect_specificity = DETECT_KEYED_VALUE

    def detect(self, path: Path) -> bool:
        path = Path(path)
        return (path / "config.json").is_file() and ct2_spec_name(path / "model.bin") == _CT2_SPEC

    def __init__(self) -> None:
        self._read: tuple[Path, dict[str, np.ndarray]] | None = None

    def _variables(self, path: Path) -> dict[str, np.ndarray]:
        """The checked variables of ``path/model.bin`` (read once per conversion)."""
        if self._read is not None and self._read[0] == path:
            return self._read[1]
        spec, revision, variables = read_ct2_model(path / "model.bin")
        if spec != _CT2_SPEC:
            raise CheckpointFormatError(f"{path}/model.bin holds a {spec!r}, not a {_CT2_SPEC}", path=path)
        if revision > 3:
            raise CheckpointFormatError(f"{path}/model.bin is WhisperSpec revision {revision}; OASR reads up to 3",
                                        path=path)
        for flag in ("decoder/scale_embeddings", "decoder/alibi"):
            if _scalar(variables, flag, 0):
                raise UnsupportedConfigError(f"{path}/model.bin sets {flag}, which Whisper never does", path=path,
                                             key=flag)
        self._read = (path, variables)
        return variables

    def load_state_dict(self, path: Path) -> dict[str, torch.Tensor]:
        path = Path(path)
        variables = self._variables(path)
        return _ct2_state_dict(variables, variables["encoder/conv1/weight"].shape[0], path)

    def build_config(self, path: Path, state_dict: dict[str, torch.Tensor]) -> WhisperConfig:
        path = Path(path)
        variables = self._variables(path)
        enc_heads, dec_heads = _scalar(variables, "encoder/num_heads"), _scalar(variables, "decoder/num_heads")
        if enc_heads is None or dec_heads is None:
            raise CheckpointFormatError(f"{path}/model.bin does not record the number of attention heads", path=path)
        conv1 = state_dict["encoder.conv1.weight"]
        n_enc = sum(1 for k in state_dict if k.startswith("encoder.layers.") and k.endswith(".fc1.weight"))
        n_dec = sum(1 for k in state_dict if k.startswith("decoder.layers.") and k.endswith(".fc1.weight"))
        vocab_size = state_dict["decoder.embed_tokens.weight"].shape[0]
        tokens = _ct2_vocabulary(path)
        if len(tokens) != vocab_size:
            raise CheckpointFormatError(f"{path}: the vocabulary has {len(tokens)} tokens, the model {vocab_size}",
                                        path=path)
        vocab = {tok: i for i, tok in enumerate(tokens)}
        raw = _read_json(path / "config.json")
        languages = None
        if vocab_size >= _MULTILINGUAL_VOCAB and raw.get("lang_ids"):
            languages = {code: int(i) for i in raw["lang_ids"] if (code := _language_code(tokens[int(i)]))}
        elif vocab_size < _MULTILINGUAL_VOCAB:
            languages = {}
        overrides = {
            "suppress_tokens": raw.get("suppress_ids") or (),
            "begin_suppress_tokens": raw.get("suppress_ids_begin"),
            "alignment_heads": raw.get("alignment_heads") or _default_alignment_heads(n_dec, dec_heads),
        }
        generation = build_generation(vocab, vocab_size, languages=languages, overrides=overrides, source=path)
        return WhisperConfig(
            vocab_size=vocab_size, num_mel_bins=conv1.shape[1], d_model=conv1.shape[0],
            encoder_layers=n_enc, encoder_attention_heads=enc_heads,
            encoder_ffn_dim=state_dict["encoder.layers.0.fc1.weight"].shape[0],
            decoder_layers=n_dec, decoder_attention_heads=dec_heads,
            decoder_ffn_dim=state_dict["decoder.layers.0.fc1.weight"].shape[0],
            max_source_positions=state_dict["encoder.embed_positions.weight"].shape[0],
            max_target_positions=state_dict["decoder.embed_positions.weight"].shape[0],
            generation=generation,
        )


class WhisperConverter(CheckpointConverter):
    """The ``whisper`` architecture's converter: a Hugging Face or a CTranslate2 directory."""

    architecture = "whisper"
    detect_specificity = DETECT_KEYED_VALUE
    expected_unused_prefixes = HFWhisperConverter.expected_unused_prefixes

    def _layout(self, path: Path) -> CheckpointConverter | None:
        for converter in (HFWhisperConverter(), CT2WhisperConverter()):
            if converter.detect(path):
                return converter
        return None

    def detect(self, path: Path) -> bool:
        return self._layout(Path(path)) is not None

    def convert(self, path: str | Path) -> ConvertedCheckpoint:
        path = Path(path)
        converter = self._layout(path)
        if converter is None:
            raise CheckpointFormatError(
                f"{path} is neither a Hugging Face Whisper directory (config.json with model_type 'whisper') nor a "
                f"CTranslate2 one (model.bin of a WhisperSpec beside config.json)", path=path)
        return converter.convert(path)
