"""Converters of NeMo ``.nemo`` archives onto the FastConformer family's Parakeet models.

A ``.nemo`` file (see :mod:`oasr_models_hf.fastconformer.nemo`) is claimed by what its
``model_config.yaml`` holds (specificity 30):

- ``nemo_ctc``: a CTC model (``EncDecCTCModelBPE``: ``decoder`` a ``ConvASRDecoder``, no ``joint``);
  ``nemo_ctc_streaming`` a cache-aware one, on the Nemotron encoder as ``nemo_rnnt_streaming`` below;
- ``nemo_rnnt``: an RNN-T model (``EncDecRNNTBPEModel``: ``decoder`` an ``RNNTDecoder``, ``joint`` an
  ``RNNTJoint``), and a hybrid RNNT+CTC model (``EncDecHybridRNNTCTCBPEModel``, which adds ``aux_ctc``):
  its RNN-T head is the default, ``architecture="nemo_ctc"`` picks its CTC head;
- ``nemo_tdt``: an RNN-T model whose loss is ``tdt`` (or whose ``decoding.model_type`` is ``tdt``); the
  durations come from ``decoding.durations``, ``loss.tdt_kwargs.durations`` or
  ``model_defaults.tdt_durations``, in that order; ``decoding.strategy: beam`` makes NeMo's TDT beam search
  (``beam.beam_size``) the default search, ``maes`` its mAES;
- ``nemo_rnnt_streaming``: a cache-aware RNN-T, hybrid or TDT model — causal subsampling, causal convolutions
  with ``layer_norm``, ``chunked_limited`` attention — on the Nemotron encoder: the config's first
  ``att_context_size`` ``[left, right]`` is ``sliding_window = left + 1`` and ``num_lookahead_tokens = right``,
  and its mask applies offline too.  (``nemo_rnnt`` and ``nemo_tdt`` claim only the other RNN-T / TDT archives.)

Config mapping (NeMo's ``ConformerEncoder`` field → OASR :class:`FastConformerConfig`): ``feat_in`` →
``num_mel_bins``, ``d_model`` → ``hidden_size``, ``n_layers``, ``n_heads``, ``d_model * ff_expansion_factor``
→ ``intermediate_size``, ``conv_kernel_size``, ``subsampling_factor``, ``subsampling_conv_channels`` (-1:
``d_model``), ``xscaling`` → ``scale_input``, ``use_bias`` → both biases; the transducer heads' ``pred_hidden``,
``pred_rnn_layers``, ``joint_hidden`` (→ ``joint_hidden_size`` when it differs) and ``activation``.  What the encoders do not
compute is refused by name: another ``subsampling`` than ``dw_striding``, another attention than ``rel_pos``,
tied position biases, another norm than ``batch_norm``, a ``feat_out`` projection, and the cache-aware
fields are read by the cache-aware converters only (``causal_downsampling``, a limited ``att_context_size``, a
causal ``conv_context_size``).

The preprocessor (``AudioToMelSpectrogramPreprocessor``) becomes the ``nemotron_logmel`` FeatureSpec with
NeMo's defaults for absent fields: 25 ms / 10 ms hann windows, n_fft 512, pre-emphasis 0.97, per-feature
normalization; its training dither is 0 at inference (NeMo's ``transcribe()`` sets it so).  Fields the
extractor does not implement (no log, a clamp guard, a power other than 2, ``frame_splicing``,
``exact_pad``, band limits) are refused by name.

Weights (``model_weights.ckpt``): NeMo's module names become the Hugging Face names the Parakeet models load
(``encoder.pre_encode.conv.N`` → ``encoder.subsampling.layers.N``, ``self_attn.linear_q`` → ``q_proj``,
``linear_pos`` → ``relative_k_proj``, ``pos_bias_u`` → ``bias_u``, ``conv.batch_norm`` → ``conv.norm``;
CTC ``decoder.decoder_layers.0`` → ``ctc_head``; ``decoder.prediction.embed`` / ``dec_rnn.lstm`` →
``decoder.embedding`` / ``decoder.lstm``; ``joint.enc`` / ``joint.pred`` / ``joint.joint_net``'s Linear →
``joint.encoder_projector`` / ``decoder_projector`` / ``head``).  The preprocessor's window and filterbank
buffers are recomputed by the frontend and left unused; so is the head a hybrid does not run.

Tokenizer: the archive's SentencePiece ``tokenizer.model`` (``tokenizer.type`` ``bpe``); the blank is the
id after the vocabulary (the heads' last output).  An emitted ``<unk>`` is text (``" ⁇ "``), as in NeMo's
transcripts.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, ClassVar

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
from oasr_models_hf.fastconformer.nemo import NEMO_SUFFIX, NemoArchive, open_archive

logger = logging.getLogger(__name__)

#: NeMo key pattern → the Hugging Face Parakeet name (applied in order; the first match renames)
_ENCODER_RENAMES = (
    (r"^encoder\.pre_encode\.conv\.", "encoder.subsampling.layers."),
    (r"^encoder\.pre_encode\.out\.", "encoder.subsampling.linear."),
    (r"\.self_attn\.linear_q\.", ".self_attn.q_proj."),
    (r"\.self_attn\.linear_k\.", ".self_attn.k_proj."),
    (r"\.self_attn\.linear_v\.", ".self_attn.v_proj."),
    (r"\.self_attn\.linear_out\.", ".self_attn.o_proj."),
    (r"\.self_attn\.linear_pos\.", ".self_attn.relative_k_proj."),
    (r"\.self_attn\.pos_bias_u$", ".self_attn.bias_u"),
    (r"\.self_attn\.pos_bias_v$", ".self_attn.bias_v"),
    (r"\.conv\.batch_norm\.", ".conv.norm."),
)


def _causal_stage(match: re.Match) -> str:
    """NeMo's dw_striding Sequential index → the Nemotron subsampling's stage module (0, [act,] dw, pw, act ...)."""
    index = int(match.group(1))
    stage, part = divmod(index - 2, 3)
    return f"encoder.subsampling.layers.{stage}.{'depthwise_conv' if part == 0 else 'pointwise_conv'}."


_STREAMING_RENAMES = (
    (r"^encoder\.pre_encode\.conv\.0\.", "encoder.subsampling.conv_in."),
    (r"^encoder\.pre_encode\.conv\.(\d+)\.", _causal_stage),
)
_TRANSDUCER_RENAMES = (
    (r"^decoder\.prediction\.embed\.", "decoder.embedding."),
    (r"^decoder\.prediction\.dec_rnn\.lstm\.", "decoder.lstm."),
    (r"^joint\.enc\.", "joint.encoder_projector."),
    (r"^joint\.pred\.", "joint.decoder_projector."),
    (r"^joint\.joint_net\.\d+\.", "joint.head."),  # [activation, (dropout,) Linear]: the one with weights
)
_PREPROCESSOR_DEFAULTS = {"sample_rate": 16000, "window_size": 0.02, "window_stride": 0.01, "window": "hann",
                          "normalize": "per_feature", "n_fft": None, "preemph": 0.97, "features": 64,
                          "lowfreq": 0, "highfreq": None, "log": True, "log_zero_guard_type": "add",
                          "log_zero_guard_value": 2 ** -24, "mag_power": 2.0, "frame_splicing": 1,
                          "exact_pad": False, "mel_norm": "slaney"}


def nemo_kind(config: dict[str, Any]) -> str:
    """``"ctc"``, ``"rnnt"``, ``"tdt"`` or ``"hybrid"`` (RNN-T + auxiliary CTC) from an archive's config."""
    if isinstance(config.get("joint"), dict):
        loss = config.get("loss") or {}
        decoding = config.get("decoding") or {}
        if loss.get("loss_name") == "tdt" or decoding.get("model_type") == "tdt":
            return "tdt"
        return "hybrid" if isinstance(config.get("aux_ctc"), dict) else "rnnt"
    decoder = config.get("decoder") or {}
    return "ctc" if str(decoder.get("_target_", "")).endswith("ConvASRDecoder") else "unknown"


def cache_aware(config: dict[str, Any]) -> bool:
    """True for NeMo's cache-aware (streaming) FastConformer: causal subsampling or a limited attention context."""
    enc = config.get("encoder") or {}
    return bool(enc.get("causal_downsampling")) or any(int(v) != -1 for v in _context_values(enc))


def _context_values(enc: dict[str, Any]) -> list[int]:
    context = enc.get("att_context_size") or [-1, -1]
    return [int(v) for pair in context for v in (pair if isinstance(pair, list | tuple) else [pair])]


def _section(path: Path, config: dict[str, Any], key: str) -> dict[str, Any]:
    section = config.get(key)
    if not isinstance(section, dict):
        raise CheckpointFormatError(f"{path}: model_config.yaml has no {key!r} section", path=path)
    return section


def _refuse(path: Path, key: str, value: Any, why: str) -> UnsupportedConfigError:
    return UnsupportedConfigError(f"{path}: model_config.yaml {key}={value!r} is not supported: {why}", path=path,
                                  key=key)


def _check_encoder(path: Path, enc: dict[str, Any]) -> None:
    rules = (("subsampling", "dw_striding", "only dw_striding subsampling is implemented"),
             ("self_attention_model", "rel_pos", "only Transformer-XL rel_pos attention is implemented"),
             ("untie_biases", True, "the position biases must be per layer (untie_biases: true)"),
             ("conv_norm_type", "batch_norm", "the convolution module's norm must be batch_norm"),
             ("feat_out", -1, "an output projection after the blocks is not implemented"),
             ("causal_downsampling", False, "causal subsampling (cache-aware configs) is read by the "
                                     "cache-aware architectures (nemo_ctc_streaming, nemo_rnnt_streaming)"))
    for key, want, why in rules:
        if enc.get(key, want) != want:
            raise _refuse(path, f"encoder.{key}", enc[key], why)
    if any(v != -1 for v in _context_values(enc)):
        raise _refuse(path, "encoder.att_context_size", enc["att_context_size"], "a limited attention context "
                      "(cache-aware configs) is read by the cache-aware architectures (nemo_ctc_streaming, "
                      "nemo_rnnt_streaming)")
    conv_context = enc.get("conv_context_size")
    k = int(enc.get("conv_kernel_size", 31))
    if conv_context not in (None, "None", [(k - 1) // 2, (k - 1) // 2]):
        raise _refuse(path, "encoder.conv_context_size", conv_context, "only the symmetric (non-causal) "
                      "convolution context is implemented")
    if enc.get("reduction") not in (None, "None"):
        raise _refuse(path, "encoder.reduction", enc["reduction"], "intermediate reduction is not implemented")


def _check_streaming_encoder(path: Path, enc: dict[str, Any]) -> dict[str, int]:
    """The trained attention geometry of a cache-aware encoder section (its first, default context size)."""
    k = int(enc.get("conv_kernel_size", 31))
    rules = (("subsampling", "dw_striding", "only dw_striding subsampling is implemented"),
             ("self_attention_model", "rel_pos", "only Transformer-XL rel_pos attention is implemented"),
             ("untie_biases", True, "the position biases must be per layer (untie_biases: true)"),
             ("feat_out", -1, "an output projection after the blocks is not implemented"),
             ("causal_downsampling", True, "the cache-aware encoder's subsampling is causal"),
             ("att_context_style", "chunked_limited", "the cache-aware encoder's mask is chunked_limited"),
             ("conv_norm_type", "layer_norm", "the cache-aware encoder's convolution norm is layer_norm"))
    for key, want, why in rules:
        if enc.get(key, want if key != "att_context_style" else "regular") != want:
            raise _refuse(path, f"encoder.{key}", enc.get(key), why)
    if enc.get("conv_context_size") not in ("causal", [k - 1, 0]):
        raise _refuse(path, "encoder.conv_context_size", enc.get("conv_context_size"),
                      "the cache-aware encoder's convolutions are causal")
    context = enc.get("att_context_size") or [-1, -1]
    left, right = (int(v) for v in (context[0] if isinstance(context[0], list | tuple) else context))
    if left < 0 or right < 0:
        raise _refuse(path, "encoder.att_context_size", context, "a cache-aware encoder needs a limited left "
                      "and right context")
    return {"sliding_window": left + 1, "num_lookahead_tokens": right}


def encoder_fields(path: Path, config: dict[str, Any], streaming: bool = False) -> dict[str, Any]:
    """The :class:`FastConformerConfig` encoder fields of an archive's ``encoder`` section (NeMo's defaults);
    ``streaming``: a cache-aware one, with the Nemotron encoder's ``sliding_window`` / ``num_lookahead_tokens``."""
    enc = _section(path, config, "encoder")
    geometry = _check_streaming_encoder(path, enc) if streaming else {}
    if not streaming:
        _check_encoder(path, enc)
    d_model = int(enc.get("d_model", 256))
    channels = int(enc.get("subsampling_conv_channels", -1))
    bias = bool(enc.get("use_bias", True))
    return dict(num_mel_bins=int(enc["feat_in"]), hidden_size=d_model, num_hidden_layers=int(enc["n_layers"]),
                num_attention_heads=int(enc.get("n_heads", 4)),
                intermediate_size=int(d_model * float(enc.get("ff_expansion_factor", 4))),
                conv_kernel_size=int(enc.get("conv_kernel_size", 31)),
                subsampling_factor=int(enc.get("subsampling_factor", 4)),
                subsampling_conv_channels=d_model if channels == -1 else channels,
                scale_input=bool(enc.get("xscaling", True)), attention_bias=bias, convolution_bias=bias, **geometry)


def feature_spec(path: Path, config: dict[str, Any], num_mel_bins: int) -> FeatureSpec:
    """The ``nemotron_logmel`` FeatureSpec of an ``AudioToMelSpectrogramPreprocessor`` section."""
    pre = _section(path, config, "preprocessor")
    target = str(pre.get("_target_", ""))
    if not target.endswith("AudioToMelSpectrogramPreprocessor"):
        raise _refuse(path, "preprocessor._target_", target, "only AudioToMelSpectrogramPreprocessor is implemented")
    p = dict(_PREPROCESSOR_DEFAULTS, **{k: v for k, v in pre.items() if v is not None or k == "highfreq"})
    rate = int(p["sample_rate"])
    fixed = (("window", "hann"), ("log", True), ("log_zero_guard_type", "add"), ("mag_power", 2.0),
             ("frame_splicing", 1), ("exact_pad", False), ("mel_norm", "slaney"), ("lowfreq", 0))
    for key, want in fixed:
        if p[key] != want:
            raise _refuse(path, f"preprocessor.{key}", p[key], f"the nemotron_logmel frontend computes {want!r}")
    if p["highfreq"] not in (None, rate / 2, rate // 2):
        raise _refuse(path, "preprocessor.highfreq", p["highfreq"], "the mel filters span 0 .. Nyquist")
    if abs(float(p["log_zero_guard_value"]) - 2 ** -24) > 1e-12:
        raise _refuse(path, "preprocessor.log_zero_guard_value", p["log_zero_guard_value"], "the guard is 2**-24")
    if p["normalize"] not in ("per_feature", None, "None", "NA"):
        raise _refuse(path, "preprocessor.normalize", p["normalize"], "only per_feature normalization is implemented")
    if int(p["features"]) != num_mel_bins:
        raise CheckpointFormatError(f"{path}: the preprocessor makes {p['features']} mel bins, the encoder reads "
                                    f"feat_in={num_mel_bins}", path=path)
    win, hop = round(float(p["window_size"]) * rate), round(float(p["window_stride"]) * rate)
    n_fft = int(p["n_fft"]) if p["n_fft"] else 2 ** (win - 1).bit_length()
    return FeatureSpec(kind="nemotron_logmel", sample_rate=rate, num_mel_bins=num_mel_bins,
                       frame_length_ms=1000.0 * win / rate, frame_shift_ms=1000.0 * hop / rate, window_type="hann",
                       snip_edges=False, low_freq=0.0, high_freq=rate / 2, preemphasis=float(p["preemph"] or 0.0),
                       normalize="per_feature" if p["normalize"] == "per_feature" else None, audio_scale=1.0,
                       options={"n_fft": n_fft})


def rename_keys(state: dict[str, torch.Tensor], rules: tuple[tuple[str, Any], ...]) -> dict[str, torch.Tensor]:
    out = {}
    for key, value in state.items():
        for pattern, repl in rules:
            new = re.sub(pattern, repl, key)
            if new != key:
                key = new
                if pattern.startswith("^"):
                    break
        out[key] = value
    return out


class _NemoConverter(CheckpointConverter):
    detect_specificity = DETECT_KEYED_VALUE
    source_file_suffixes = (NEMO_SUFFIX,)
    expected_unused_prefixes = ("preprocessor.", "encoder.pos_enc.")
    #: the config kinds this converter claims
    kinds: ClassVar[tuple[str, ...]] = ()
    #: True: claims only cache-aware configs; False: only the others; None: both (refusing by name what it lacks)
    streaming: ClassVar[bool | None] = None

    def detect(self, path: Path) -> bool:
        """A ``.nemo`` file of this converter's kinds; an unsafe or unreadable one raises, naming why."""
        path = Path(path)
        if path.suffix != NEMO_SUFFIX or not path.is_file():
            return False
        config = open_archive(path).config
        return nemo_kind(config) in self.kinds and self.streaming in (None, cache_aware(config))

    def archive(self, path: Path) -> NemoArchive:
        path = Path(path)
        if path.is_dir() or path.suffix != NEMO_SUFFIX:
            raise CheckpointFormatError(f"{path} is not a .nemo archive (the {self.architecture!r} converter reads "
                                        f"a NeMo .nemo file)", path=path)
        return open_archive(path)

    def head_renames(self, kind: str) -> tuple[tuple[str, Any], ...]:
        raise NotImplementedError

    def load_state_dict(self, path: Path) -> dict[str, torch.Tensor]:
        archive = self.archive(path)
        kind = nemo_kind(archive.config)
        return rename_keys(archive.state_dict(), self.head_renames(kind) + _ENCODER_RENAMES)

    def tokenizer_spec(self, path: Path, config: FastConformerConfig) -> TokenizerSpec:
        archive = self.archive(path)
        tok = archive.config.get("tokenizer") or {}
        kind = tok.get("type", "bpe")
        if kind != "bpe":
            raise _refuse(archive.path, "tokenizer.type", kind, "only SentencePiece (bpe) tokenizers are read")
        model = archive.extract(str(tok.get("model_path") or tok.get("model") or "tokenizer.model"), "the SentencePiece tokenizer model")
        return TokenizerSpec(kind="sentencepiece", files={"model": str(model)}, special_ids=(config.blank_id,),
                             options={"show_unknown": True})

    def feature_spec(self, path: Path, config: FastConformerConfig) -> FeatureSpec:
        return feature_spec(Path(path), self.archive(path).config, config.num_mel_bins)


def _head_vocab(path: Path, state: dict[str, torch.Tensor], key: str) -> int:
    weight = state.get(key)
    if weight is None:
        raise CheckpointFormatError(f"{path}: model_weights.ckpt has no {key!r}", path=path)
    return int(weight.shape[0])


class NemoCtcConverter(_NemoConverter):
    """A ``.nemo`` CTC archive (``EncDecCTCModelBPE``), or a hybrid's CTC head when asked for by name."""

    architecture = "nemo_ctc"
    kinds = ("ctc",)
    streaming: ClassVar[bool | None] = False
    expected_unused_prefixes = _NemoConverter.expected_unused_prefixes + ("decoder.prediction.", "joint.")

    def head_renames(self, kind: str) -> tuple[tuple[str, Any], ...]:
        prefix = r"^ctc_decoder\." if kind == "hybrid" else r"^decoder\."
        return ((prefix + r"decoder_layers\.0\.", "ctc_head."),)

    def build_config(self, path: Path, state_dict: dict[str, torch.Tensor]) -> ParakeetCtcConfig:
        archive = self.archive(path)
        vocab = _head_vocab(archive.path, state_dict, "ctc_head.weight")
        return self.config_class(vocab_size=vocab, blank_id=vocab - 1,
                                 **encoder_fields(archive.path, archive.config, streaming=bool(self.streaming)))

    @property
    def config_class(self):
        return ParakeetCtcConfig

    def decoding_defaults(self, path: Path, config: ParakeetCtcConfig) -> DecodingDefaults:
        return DecodingDefaults(decode_type="ctc", blank_id=config.blank_id)


class NemoCtcStreamingConverter(NemoCtcConverter):
    """A cache-aware ``.nemo`` CTC archive on the Nemotron encoder (or a cache-aware hybrid's CTC head when asked
    for by name), offline with the trained ``chunked_limited`` mask, streaming on the ``slot`` backend."""

    architecture = "nemo_ctc_streaming"
    streaming = True

    @property
    def config_class(self):  # the Nemotron module imports only when a cache-aware archive loads
        from oasr_models_hf.fastconformer.nemotron import NemotronCtcConfig

        return NemotronCtcConfig

    def head_renames(self, kind: str) -> tuple[tuple[str, Any], ...]:
        return super().head_renames(kind) + _STREAMING_RENAMES


class NemoRnntConverter(_NemoConverter):
    """A ``.nemo`` RNN-T archive (``EncDecRNNTBPEModel``) or a hybrid RNNT+CTC one (its RNN-T head)."""

    architecture = "nemo_rnnt"
    kinds: ClassVar[tuple[str, ...]] = ("rnnt", "hybrid")
    streaming: ClassVar[bool | None] = False
    config_class: ClassVar[type[ParakeetRnntConfig]] = ParakeetRnntConfig
    expected_unused_prefixes = _NemoConverter.expected_unused_prefixes + ("ctc_decoder.",)

    def head_renames(self, kind: str) -> tuple[tuple[str, Any], ...]:
        return _TRANSDUCER_RENAMES

    def head_fields(self, path: Path, config: dict[str, Any]) -> dict[str, Any]:
        return {}

    def build_config(self, path: Path, state_dict: dict[str, torch.Tensor]) -> ParakeetRnntConfig:
        archive = self.archive(path)
        cfg, where = archive.config, archive.path
        prednet = _section(where, _section(where, cfg, "decoder"), "prednet")
        jointnet = _section(where, _section(where, cfg, "joint"), "jointnet")
        decoder = cfg["decoder"]
        if decoder.get("normalization_mode") not in (None, "None"):
            raise _refuse(where, "decoder.normalization_mode", decoder["normalization_mode"],
                          "the LSTM predictor has no normalization")
        if not decoder.get("blank_as_pad", True):
            raise _refuse(where, "decoder.blank_as_pad", False, "the blank must be the embedding's padding row")
        hidden = int(prednet["pred_hidden"])
        joint_hidden = int(jointnet.get("joint_hidden", hidden))
        vocab = _head_vocab(where, state_dict, "decoder.embedding.weight")
        greedy = (cfg.get("decoding") or {}).get("greedy") or {}
        max_symbols = greedy.get("max_symbols", greedy.get("max_symbols_per_step")) or 10
        return self.config_class(vocab_size=vocab, blank_id=vocab - 1, decoder_hidden_size=hidden,
                                 num_decoder_layers=int(prednet.get("pred_rnn_layers", 1)),
                                 joint_act=str(jointnet.get("activation", "relu")),
                                 joint_hidden_size=None if joint_hidden == hidden else joint_hidden,
                                 max_symbols_per_step=int(max_symbols),
                                 **encoder_fields(where, cfg, streaming=bool(self.streaming)),
                                 **self.head_fields(where, cfg))

    def decoding_defaults(self, path: Path, config: ParakeetRnntConfig) -> DecodingDefaults:
        return DecodingDefaults(decode_type="transducer", blank_id=config.blank_id,
                                options={"max_symbols": config.max_symbols_per_step})


def tdt_fields(path: Path, config: dict[str, Any]) -> dict[str, Any]:
    """A TDT archive's durations: ``decoding.durations``, ``loss.tdt_kwargs.durations`` or
    ``model_defaults.tdt_durations``, the first present."""
    loss = (config.get("loss") or {}).get("tdt_kwargs") or {}
    for durations in ((config.get("decoding") or {}).get("durations"), loss.get("durations"),
                      (config.get("model_defaults") or {}).get("tdt_durations")):
        if durations:
            return {"tdt_durations": tuple(int(d) for d in durations)}
    raise CheckpointFormatError(f"{path}: a TDT model_config.yaml names no durations (decoding.durations, "
                                f"loss.tdt_kwargs.durations or model_defaults.tdt_durations)", path=path)


def tdt_decoding_defaults(path: Path, config: dict[str, Any], defaults: DecodingDefaults) -> DecodingDefaults:
    """Greedy, or NeMo's TDT beam search when the archive's ``decoding.strategy`` is ``beam`` or ``maes``
    (its ``beam.beam_size``, default 4; mAES with NeMo's default settings); other strategies
    (``malsd_batch``, ...) decode greedily, with a warning naming the strategy."""
    decoding = config.get("decoding") or {}
    strategy = decoding.get("strategy")
    if strategy not in ("beam", "maes"):
        if strategy not in (None, "greedy", "greedy_batch"):
            logger.warning("%s: decoding.strategy %r is not implemented for TDT; decoding greedily (beam_size > 1 "
                           "or search='maes' selects NeMo's beam searches)", path, strategy)
        return defaults
    beam = decoding.get("beam") or {}
    fixed = [("score_norm", True), ("softmax_temperature", 1.0)]
    if strategy == "maes":
        fixed += [("maes_num_steps", 2), ("maes_prefix_alpha", 1), ("maes_expansion_gamma", 2.3),
                  ("maes_expansion_beta", 2)]
    for key, want in fixed:
        if beam.get(key, want) != want:
            raise _refuse(path, f"decoding.beam.{key}", beam[key],
                          f"the TDT beam search ranks as NeMo's default ({key}={want})")
    return DecodingDefaults(decode_type=defaults.decode_type, blank_id=defaults.blank_id,
                            options=dict(defaults.options, search="maes" if strategy == "maes" else "modified_beam",
                                         beam_size=int(beam.get("beam_size", 4))))


class NemoTdtConverter(NemoRnntConverter):
    """A ``.nemo`` TDT archive (``EncDecRNNTBPEModel`` with the ``tdt`` loss), not cache-aware."""

    architecture = "nemo_tdt"
    kinds = ("tdt",)
    config_class = ParakeetTdtConfig

    def head_fields(self, path: Path, config: dict[str, Any]) -> dict[str, Any]:
        return tdt_fields(path, config)

    def decoding_defaults(self, path: Path, config: ParakeetRnntConfig) -> DecodingDefaults:
        archive = self.archive(path)
        return tdt_decoding_defaults(archive.path, archive.config, super().decoding_defaults(path, config))


class NemoRnntStreamingConverter(NemoRnntConverter):
    """A cache-aware ``.nemo`` RNN-T archive (or hybrid: its RNN-T head; or TDT: its durations) on the Nemotron
    encoder, offline with the trained ``chunked_limited`` mask of the config's first (default)
    ``att_context_size``."""

    architecture = "nemo_rnnt_streaming"
    kinds = ("rnnt", "hybrid", "tdt")
    streaming = True

    def head_fields(self, path: Path, config: dict[str, Any]) -> dict[str, Any]:
        return tdt_fields(path, config) if nemo_kind(config) == "tdt" else {}

    def decoding_defaults(self, path: Path, config: ParakeetRnntConfig) -> DecodingDefaults:
        archive = self.archive(path)
        defaults = super().decoding_defaults(path, config)
        if nemo_kind(archive.config) != "tdt":
            return defaults
        return tdt_decoding_defaults(archive.path, archive.config, defaults)

    @property
    def config_class(self):  # the Nemotron module imports only when a cache-aware archive loads
        from oasr_models_hf.fastconformer.nemotron import NemotronAsrConfig

        return NemotronAsrConfig

    def head_renames(self, kind: str) -> tuple[tuple[str, Any], ...]:
        return _TRANSDUCER_RENAMES + _STREAMING_RENAMES


__all__ = ["NemoCtcConverter", "NemoCtcStreamingConverter", "NemoRnntConverter", "NemoRnntStreamingConverter", "NemoTdtConverter",
           "feature_spec", "nemo_kind"]
