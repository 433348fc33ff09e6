"""icefall transducer release directory → ``transducer`` model: :class:`IcefallTransducerConverter`.

The whole configuration is inferred from the checkpoint's tensor shapes, as for every icefall
release (a release ships no config file):

- ``decoder.embedding.weight`` (V, D): vocabulary and decoder dim; ``decoder.conv.weight``
  (D, group size, context): the context size (no conv: context 1);
- ``joiner.encoder_proj.weight`` (J, E), ``joiner.decoder_proj.weight`` (J, D),
  ``joiner.output_linear.weight`` (V, J): the joiner;
- the encoder, by the Zipformer converter's shape inference.

Not auto-detected: an icefall directory sniffs as a Zipformer (CTC) release, and a hybrid
checkpoint carries both heads, so a transducer is loaded with ``architecture="transducer"``.  The
training-only ``simple_am_proj`` / ``simple_lm_proj`` (pruned RNN-T loss) are declared unused; a
``ctc_output.*`` head is not part of this architecture and its drop is a named warning.

Decoding defaults are icefall's ``decode.py``: blank ``<blk>`` (0), one symbol per frame for greedy
search, beam 4 for modified beam search.  ``<unk>`` is not suppressed: ``decode.py`` reads its id but
never hands it to the searches (they fall back to ``getattr(model, "unk_id", blank_id)``, and the
model has no ``unk_id``), so icefall's own decoding may emit it.
"""

from __future__ import annotations

from pathlib import Path

import torch

from oasr.checkpoints import DETECT_ASSET_LAYOUT, CheckpointConverter
from oasr.errors import CheckpointFormatError
from oasr.models import DecodingDefaults, FeatureSpec, TokenizerSpec
from oasr_models_icefall import release
from oasr_models_icefall.transducer.config import JoinerConfig, StatelessDecoderConfig, TransducerModelConfig

#: tensors every icefall transducer checkpoint has
REQUIRED_KEYS = ("decoder.embedding.weight", "joiner.encoder_proj.weight", "joiner.decoder_proj.weight",
                 "joiner.output_linear.weight")
CTC_HINT = ("this architecture decodes through the transducer head only, so the checkpoint's CTC head is "
            "unused; load the directory without architecture='transducer' (as a Zipformer CTC model) to decode "
            "it with CTC")
#: icefall decode.py defaults: --max-sym-per-frame 1, --beam-size 4
DEFAULT_MAX_SYMBOLS = 1
DEFAULT_BEAM = 4


def _shape(state: dict[str, torch.Tensor], key: str, file: Path, dims: int) -> tuple[int, ...]:
    value = state[key]
    if value.dim() != dims:
        raise CheckpointFormatError(f"{file}: {key} has shape {tuple(value.shape)}, expected {dims} dimensions",
                                    path=file)
    return tuple(value.shape)


def decoder_config(state: dict[str, torch.Tensor], file: Path, blank_id: int) -> StatelessDecoderConfig:
    """The stateless decoder from ``decoder.embedding.weight`` and ``decoder.conv.weight``."""
    vocab, dim = _shape(state, "decoder.embedding.weight", file, 2)
    if "decoder.conv.weight" not in state:
        return StatelessDecoderConfig(vocab_size=vocab, decoder_dim=dim, blank_id=blank_id, context_size=1)
    out, group, context = _shape(state, "decoder.conv.weight", file, 3)
    if out != dim or dim % group:
        raise CheckpointFormatError(f"{file}: decoder.conv.weight {(out, group, context)} does not fit decoder dim "
                                    f"{dim} (expected ({dim}, group size, context size))", path=file)
    return StatelessDecoderConfig(vocab_size=vocab, decoder_dim=dim, blank_id=blank_id, context_size=context,
                                  conv_group_size=group)


def joiner_config(state: dict[str, torch.Tensor], file: Path) -> JoinerConfig:
    """The joiner from its three projections (their shapes must agree on the joiner dim)."""
    joiner, encoder_dim = _shape(state, "joiner.encoder_proj.weight", file, 2)
    joiner_d, decoder_dim = _shape(state, "joiner.decoder_proj.weight", file, 2)
    vocab, joiner_o = _shape(state, "joiner.output_linear.weight", file, 2)
    if not joiner == joiner_d == joiner_o:
        raise CheckpointFormatError(
            f"{file}: the joiner's projections disagree on the joiner dim (encoder_proj {joiner}, decoder_proj "
            f"{joiner_d}, output_linear {joiner_o})", path=file)
    return JoinerConfig(encoder_dim=encoder_dim, decoder_dim=decoder_dim, joiner_dim=joiner, vocab_size=vocab)


class IcefallTransducerConverter(CheckpointConverter):
    """icefall transducer releases (``exp/pretrained.pt`` + ``data/lang_bpe_*``) → ``transducer``."""

    architecture = "transducer"
    detect_specificity = DETECT_ASSET_LAYOUT
    expected_unused_prefixes = ("simple_am_proj.", "simple_lm_proj.")
    capability_drop_hints = {"ctc_output.": CTC_HINT}

    def __init__(self, checkpoint_name: str | None = None):
        self.checkpoint_name = checkpoint_name

    def detect(self, path: Path) -> bool:
        """Never claims a directory: a transducer is loaded with ``architecture="transducer"``."""
        return False

    def load_state_dict(self, path: Path) -> dict[str, torch.Tensor]:
        return release.load_state_dict(path, self.checkpoint_name)

    def build_config(self, path: Path, state_dict: dict[str, torch.Tensor]) -> TransducerModelConfig:
        from oasr_models_icefall.zipformer.convert import infer_zipformer_config

        file = release.checkpoint_file(path, self.checkpoint_name)
        missing = [key for key in REQUIRED_KEYS if key not in state_dict]
        if missing:
            hint = " (it has a CTC head: load it without architecture='transducer')" if any(
                k.startswith("ctc_output.") for k in state_dict) else ""
            raise CheckpointFormatError(f"{file} is not an icefall transducer checkpoint: it lacks "
                                        f"{', '.join(missing)}{hint}", path=file)
        blank = release.special_id(path, "<blk>", 0)
        decoder = decoder_config(state_dict, file, blank)
        joiner = joiner_config(state_dict, file)
        encoder = infer_zipformer_config(state_dict)
        if decoder.vocab_size != joiner.vocab_size or joiner.decoder_dim != decoder.decoder_dim:
            raise CheckpointFormatError(
                f"{file}: decoder.embedding.weight {(decoder.vocab_size, decoder.decoder_dim)} does not match the "
                f"joiner (vocabulary {joiner.vocab_size}, decoder dim {joiner.decoder_dim})", path=file)
        if joiner.encoder_dim != encoder.output_size:
            raise CheckpointFormatError(f"{file}: joiner.encoder_proj takes {joiner.encoder_dim} features but the "
                                        f"encoder outputs {encoder.output_size}", path=file)
        return TransducerModelConfig(vocab_size=decoder.vocab_size, encoder=encoder, decoder=decoder, joiner=joiner)

    def tokenizer_spec(self, path: Path, config: TransducerModelConfig) -> TokenizerSpec:
        return release.tokenizer_spec(path, config.vocab_size)

    def feature_spec(self, path: Path, config: TransducerModelConfig) -> FeatureSpec:
        return release.feature_spec(config.encoder.feature_dim)

    def decoding_defaults(self, path: Path, config: TransducerModelConfig) -> DecodingDefaults:
        return DecodingDefaults(decode_type="transducer", blank_id=config.blank_id,
                                options={"max_symbols": DEFAULT_MAX_SYMBOLS, "beam_size": DEFAULT_BEAM})
