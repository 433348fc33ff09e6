"""icefall Zipformer release directory → ``zipformer`` (CTC) model: :class:`IcefallConverter`.

icefall publishes no config with its weights, so the whole Zipformer2 config is inferred from
tensor shapes (:func:`infer_zipformer_config`, which the transducer converter reuses):

- stacks: ``encoder.encoders.N``; downsampling from ``encoders.N.downsample.bias`` (absent: 1);
- per stack: layers counted, dim from ``norm.bias``, feed-forward dim from ``feed_forward2``,
  kernel from the depthwise convolution — a causal release has ``depthwise_conv.causal_conv`` +
  ``chunkwise_conv`` where a non-causal one has ``depthwise_conv.weight``;
- attention: ``linear_pos`` is (heads · pos_head_dim, pos_dim), ``self_attn_weights.in_proj`` is
  ((2 · query_head_dim + pos_head_dim) · heads, dim) and ``self_attn1.in_proj`` is
  (heads · value_head_dim, dim).  Those three shapes fix the head dims only once the head count
  is known, and no tensor holds it: icefall's ``pos_head_dim`` is 4 in every recipe and release
  (the default of ``--pos-head-dim``), so heads = rows(linear_pos) / 4.

``encoder_unmasked_dim`` (training-time feature masking) leaves no trace in the weights and is not
part of the config.  A causal release decodes at the geometry releases are published with,
chunk 16 / left context 128 embed frames (:mod:`.config`).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from oasr.checkpoints import DETECT_KEYED_VALUE, CheckpointConverter
from oasr.errors import CheckpointFormatError
from oasr.models import DecodingDefaults, FeatureSpec, TokenizerSpec
from oasr_models_icefall import release
from oasr_models_icefall.zipformer.config import (
    RELEASE_CHUNK_SIZE,
    RELEASE_LEFT_CONTEXT_FRAMES,
    ZipformerCtcModelConfig,
    ZipformerEncoderConfig,
)

#: icefall's ``--pos-head-dim`` (every recipe and release uses it; see the module docstring)
POS_HEAD_DIM = 4
#: icefall's ``--feature-dim`` (80 fbank bins), used when the embed width admits several
DEFAULT_FEATURE_DIM = 80
CTC_WEIGHT = "ctc_output.1.weight"
#: a key only a Zipformer2 encoder has (the shared attention weights of its first layer)
ZIPFORMER_MARKER = re.compile(r"^encoder\.encoders\.0\.(?:encoder\.)?layers\.0\.self_attn_weights\.in_proj\.weight$")
TRANSDUCER_PREFIXES = ("decoder.", "joiner.")
TRANSDUCER_HINT = ("the transducer branch (decoder.*, joiner.*) is not used by the zipformer CTC model; load the "
                   "directory with architecture='transducer' to decode with it")
#: icefall's zipformer ctc_decode.py default for prefix beam search
DEFAULT_BEAM = 4


def _shape(state: dict[str, torch.Tensor], key: str, dims: int) -> tuple[int, ...]:
    value = state.get(key)
    if value is None:
        raise CheckpointFormatError(f"the checkpoint has no {key!r}, which every icefall Zipformer2 encoder has")
    if value.dim() != dims:
        raise CheckpointFormatError(f"{key!r} has shape {tuple(value.shape)}, expected {dims} dimensions")
    return tuple(int(d) for d in value.shape)


def _indices(state: dict[str, torch.Tensor], pattern: str) -> list[int]:
    found = sorted({int(m.group(1)) for k in state if (m := re.match(pattern, k))})
    if not found or found != list(range(len(found))):
        raise CheckpointFormatError(f"keys matching {pattern!r} are numbered {found}, expected 0..N-1")
    return found


def _div(total: int, part: int, what: str) -> int:
    if part <= 0 or total % part:
        raise CheckpointFormatError(f"{what}: {total} is not a multiple of {part}")
    return total // part


def _feature_dim(out_width: int) -> int:
    """The fbank bins whose ``((F - 1) // 2 - 1) // 2`` is ``out_width`` (80 when it fits)."""
    fits = [f for f in range(4 * out_width + 3, 4 * out_width + 7) if ((f - 1) // 2 - 1) // 2 == out_width]
    return DEFAULT_FEATURE_DIM if DEFAULT_FEATURE_DIM in fits else fits[0]


def _stack(state: dict[str, torch.Tensor], prefix: str, i: int) -> dict[str, object]:
    """One stack's fields from its first layer's shapes."""
    ds_key = f"{prefix}encoders.{i}.downsample.bias"
    ds = _shape(state, ds_key, 1)[0] if ds_key in state else 1
    layers = f"{prefix}encoders.{i}.{'encoder.' if ds != 1 else ''}layers."
    num_layers = len(_indices(state, rf"^{re.escape(layers)}(\d+)\."))
    lp = f"{layers}0."
    dim = _shape(state, f"{lp}norm.bias", 1)[0]
    pos_rows, pos_dim = _shape(state, f"{lp}self_attn_weights.linear_pos.weight", 2)
    heads = _div(pos_rows, POS_HEAD_DIM, f"{lp}self_attn_weights.linear_pos rows (heads x pos_head_dim)")
    in_rows = _shape(state, f"{lp}self_attn_weights.in_proj.weight", 2)[0]
    query_head_dim = _div(_div(in_rows, heads, "self_attn_weights.in_proj rows") - POS_HEAD_DIM, 2,
                          f"{lp}self_attn_weights.in_proj (2 x query_head_dim + pos_head_dim)")
    value_head_dim = _div(_shape(state, f"{lp}self_attn1.in_proj.weight", 2)[0], heads, "self_attn1.in_proj rows")
    conv = f"{lp}conv_module1.depthwise_conv."
    causal = f"{conv}causal_conv.weight" in state
    kernel = _shape(state, f"{conv}{'chunkwise_conv.' if causal else ''}weight", 3)[2]
    return dict(downsampling_factor=ds, num_encoder_layers=num_layers, encoder_dim=dim, num_heads=heads,
                query_head_dim=query_head_dim, value_head_dim=value_head_dim, pos_head_dim=POS_HEAD_DIM,
                pos_dim=pos_dim, feedforward_dim=_shape(state, f"{lp}feed_forward2.in_proj.weight", 2)[0],
                cnn_module_kernel=kernel, causal=causal)


def infer_zipformer_config(state_dict: dict[str, torch.Tensor], prefix: str = "encoder.",
                           embed_prefix: str = "encoder_embed.") -> ZipformerEncoderConfig:
    """The :class:`ZipformerEncoderConfig` an icefall state dict was trained with, from shapes alone.

    ``prefix`` / ``embed_prefix`` are the Zipformer2 and Conv2dSubsampling key prefixes (icefall's
    ``encoder.`` and ``encoder_embed.``).  Raises :class:`CheckpointFormatError` naming the key that
    is missing or inconsistent.
    """
    stacks = [_stack(state_dict, prefix, i) for i in _indices(state_dict, rf"^{re.escape(prefix)}encoders\.(\d+)\.")]
    pos_dims = {s["pos_dim"] for s in stacks}
    causal = {s["causal"] for s in stacks}
    if len(pos_dims) != 1 or len(causal) != 1:
        raise CheckpointFormatError(f"stacks disagree on pos_dim {sorted(pos_dims)} or causality {sorted(causal)}")
    channels = tuple(_shape(state_dict, f"{embed_prefix}conv.{j}.weight", 4)[0] for j in (0, 4, 7))
    out_width = _div(_shape(state_dict, f"{embed_prefix}out.weight", 2)[1], channels[-1], f"{embed_prefix}out inputs")
    is_causal = causal.pop()
    per_stack = {field: tuple(s[field] for s in stacks) for field in (
        "downsampling_factor", "num_encoder_layers", "encoder_dim", "num_heads", "query_head_dim", "value_head_dim",
        "pos_head_dim", "feedforward_dim", "cnn_module_kernel")}
    return ZipformerEncoderConfig(
        feature_dim=_feature_dim(out_width), embed_channels=channels, pos_dim=pos_dims.pop(), causal=is_causal,
        output_downsampling_factor=_shape(state_dict, f"{prefix}downsample_output.bias", 1)[0],
        chunk_size=RELEASE_CHUNK_SIZE if is_causal else -1,
        left_context_frames=RELEASE_LEFT_CONTEXT_FRAMES if is_causal else -1, **per_stack)


class IcefallConverter(CheckpointConverter):
    """icefall Zipformer CTC releases (``exp/*.pt`` + ``data/lang_bpe_*``) → ``zipformer``.

    Claims any icefall release whose weights carry a Zipformer2 encoder (and one whose weights it
    cannot read, so the loader's refusal names the file and the export to run).  A transducer
    release without a CTC head is refused with the instruction to pass ``architecture="transducer"``;
    a hybrid one loads its CTC branch, and the transducer branch is reported as not used.
    """

    architecture = "zipformer"
    detect_specificity = DETECT_KEYED_VALUE
    expected_unused_prefixes = ("simple_am_proj.", "simple_lm_proj.")
    capability_drop_hints = {prefix: TRANSDUCER_HINT for prefix in TRANSDUCER_PREFIXES}

    def __init__(self, checkpoint_name: str | None = None):
        self.checkpoint_name = checkpoint_name

    def detect(self, path: Path) -> bool:
        path = Path(path)
        if not release.is_release_dir(path):
            return False
        keys = release.checkpoint_keys(path, self.checkpoint_name)
        return not keys or any(ZIPFORMER_MARKER.match(k) for k in keys)

    def load_state_dict(self, path: Path) -> dict[str, torch.Tensor]:
        return release.load_state_dict(path, self.checkpoint_name)

    def build_config(self, path: Path, state_dict: dict[str, torch.Tensor]) -> ZipformerCtcModelConfig:
        if CTC_WEIGHT not in state_dict:
            if any(k.startswith(TRANSDUCER_PREFIXES) for k in state_dict):
                raise CheckpointFormatError(
                    f"{path} is an icefall Zipformer transducer without a CTC head ({CTC_WEIGHT}); load it with "
                    f"architecture='transducer'", path=path)
            raise CheckpointFormatError(f"{path}: the checkpoint has no CTC head ({CTC_WEIGHT})", path=path)
        try:
            encoder = infer_zipformer_config(state_dict)
        except CheckpointFormatError as exc:
            raise CheckpointFormatError(f"{path}: {exc}", path=path) from exc
        vocab, width = (int(d) for d in state_dict[CTC_WEIGHT].shape)
        if width != encoder.output_size:
            raise CheckpointFormatError(f"{path}: {CTC_WEIGHT} takes {width} inputs but the encoder outputs "
                                        f"{encoder.output_size}", path=path)
        return ZipformerCtcModelConfig(vocab_size=vocab, encoder=encoder,
                                       blank_id=release.special_id(path, "<blk>", 0))

    def tokenizer_spec(self, path: Path, config: ZipformerCtcModelConfig) -> TokenizerSpec:
        return release.tokenizer_spec(path, config.vocab_size)

    def feature_spec(self, path: Path, config: ZipformerCtcModelConfig) -> FeatureSpec:
        return release.feature_spec(num_mel_bins=config.encoder.feature_dim)

    def decoding_defaults(self, path: Path, config: ZipformerCtcModelConfig) -> DecodingDefaults:
        return DecodingDefaults(decode_type="ctc", blank_id=config.blank_id, options={"beam_size": DEFAULT_BEAM})
