"""icefall ``conformer_ctc3`` release directory → ``icefall_conformer``: :class:`IcefallConformerCtcConverter`.

A release is what the recipe's ``export.py`` writes (``exp/pretrained.pt`` = ``{"model": state_dict}``)
beside ``data/lang_bpe_<N>/{bpe.model,tokens.txt}`` (read by :mod:`oasr_models_icefall.release`).
The directory carries no config: every field is inferred from tensor shapes (:func:`infer_config`).

Detection is by the checkpoint's own keys: a release whose state dict has conformer_ctc3's scaled
Conformer layers (``encoder.encoder.layers.N.feed_forward_macaron.0.weight_scale``) and its CTC head
(``ctc_output_module.1.weight``).  Zipformer releases lack both; a pruned-transducer Conformer lacks
the CTC head, so neither is claimed.
"""

from __future__ import annotations

import re
from pathlib import Path

import attrs
import torch

from oasr.checkpoints import DETECT_KEYED_VALUE, CheckpointConverter
from oasr.errors import CheckpointFormatError
from oasr.models import DecodingDefaults, FeatureSpec, TokenizerSpec
from oasr_models_icefall import release
from oasr_models_icefall.conformer_ctc3.config import ConformerCtcConfig

ARCHITECTURE = "icefall_conformer"
LAYER_PREFIX = "encoder.encoder.layers."
EMBED_PREFIX = "encoder.encoder_embed."
CTC_WEIGHT = "ctc_output_module.1.weight"
#: the key whose presence marks a conformer_ctc3 layer (a ScaledLinear of the macaron feed-forward)
LAYER_MARKER = re.compile(r"^encoder\.encoder\.layers\.\d+\.feed_forward_macaron\.0\.weight_scale$")
#: icefall's conformer_ctc3 decode.py default for prefix beam search
DEFAULT_BEAM = 4


def _tensor(state: dict[str, torch.Tensor], key: str, dims: int, path: Path) -> torch.Tensor:
    value = state.get(key)
    if value is None:
        raise CheckpointFormatError(
            f"{path}: the checkpoint has no {key!r}, so it is not an icefall conformer_ctc3 CTC model "
            f"(a Zipformer or a transducer release needs another architecture)", path=path)
    if value.dim() != dims:
        raise CheckpointFormatError(f"{path}: {key!r} has shape {tuple(value.shape)}, expected {dims} dimensions",
                                    path=path)
    return value


def infer_config(state: dict[str, torch.Tensor], path: Path) -> ConformerCtcConfig:
    """The whole config from tensor shapes (``causal`` excepted: it leaves no trace in the weights).

    ``feature_dim`` is the one value the shapes fix only up to the subsampling's rounding
    (``out`` sees ((F − 1) // 2 − 1) // 2 bins, four values of F per width): the width n is read as
    F = 4n + 4, which is 80 for icefall's 80-bin fbank.
    """
    convs = [_tensor(state, f"{EMBED_PREFIX}conv.{i}.weight", 4, path) for i in (0, 3, 6)]
    out = _tensor(state, f"{EMBED_PREFIX}out.weight", 2, path)
    ctc = _tensor(state, CTC_WEIGHT, 2, path)
    indices = sorted({int(m.group(1)) for k in state if (m := re.match(r"^encoder\.encoder\.layers\.(\d+)\.", k))})
    if not indices or indices != list(range(len(indices))):
        raise CheckpointFormatError(f"{path}: encoder layers {indices} are not numbered 0..N-1", path=path)
    layer = f"{LAYER_PREFIX}0."
    pos_bias = _tensor(state, f"{layer}self_attn.pos_bias_u", 2, path)
    ff = _tensor(state, f"{layer}feed_forward.0.weight", 2, path)
    depthwise = _tensor(state, f"{layer}conv_module.depthwise_conv.weight", 3, path)
    channels = tuple(int(c.shape[0]) for c in convs)
    width, rem = divmod(int(out.shape[1]), channels[-1])
    if rem:
        raise CheckpointFormatError(f"{path}: {EMBED_PREFIX}out.weight has {out.shape[1]} inputs, not a multiple "
                                    f"of the last convolution's {channels[-1]} channels", path=path)
    encoder_dim = int(out.shape[0])
    nhead, head_dim = (int(n) for n in pos_bias.shape)
    if nhead * head_dim != encoder_dim:
        raise CheckpointFormatError(f"{path}: pos_bias_u {tuple(pos_bias.shape)} does not split encoder_dim "
                                    f"{encoder_dim} into heads", path=path)
    return ConformerCtcConfig(
        vocab_size=int(ctc.shape[0]), feature_dim=4 * width + 4, encoder_dim=encoder_dim, nhead=nhead,
        dim_feedforward=int(ff.shape[0]), num_encoder_layers=len(indices), cnn_module_kernel=int(depthwise.shape[-1]),
        subsampling_channels=channels)


class IcefallConformerCtcConverter(CheckpointConverter):
    """icefall ``conformer_ctc3`` releases (``exp/*.pt`` + ``data/lang_bpe_*``) → ``icefall_conformer``."""

    architecture = ARCHITECTURE
    #: the checkpoint's own keys name the architecture (not just the directory layout)
    detect_specificity = DETECT_KEYED_VALUE

    def __init__(self, checkpoint_name: str | None = None):
        self.checkpoint_name = checkpoint_name

    def detect(self, path: Path) -> bool:
        path = Path(path)
        if not release.is_release_dir(path):
            return False
        keys = release.checkpoint_keys(path, self.checkpoint_name)
        return CTC_WEIGHT in keys and any(LAYER_MARKER.match(k) for k in keys)

    def load_state_dict(self, path: Path) -> dict[str, torch.Tensor]:
        return release.load_state_dict(path, self.checkpoint_name)

    def build_config(self, path: Path, state_dict: dict[str, torch.Tensor]) -> ConformerCtcConfig:
        config = infer_config(state_dict, path)
        blank = release.special_id(path, "<blk>", 0)
        return attrs.evolve(config, blank_id=blank)

    def tokenizer_spec(self, path: Path, config: ConformerCtcConfig) -> TokenizerSpec:
        return release.tokenizer_spec(path, config.vocab_size)

    def feature_spec(self, path: Path, config: ConformerCtcConfig) -> FeatureSpec:
        return release.feature_spec(num_mel_bins=config.feature_dim)

    def decoding_defaults(self, path: Path, config: ConformerCtcConfig) -> DecodingDefaults:
        return DecodingDefaults(decode_type="ctc", blank_id=config.blank_id, options={"beam_size": DEFAULT_BEAM})
