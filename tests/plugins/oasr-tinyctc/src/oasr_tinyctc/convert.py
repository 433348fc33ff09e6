"""The tinyctc checkpoint format: ``tinyctc.json`` (config), ``model.pt`` (state dict), ``units.txt``."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from oasr import serde
from oasr.checkpoints import DETECT_KEYED_VALUE, CheckpointConverter, extract_state_dict, load_torch_checkpoint
from oasr.models import DecodingDefaults, FeatureSpec, TokenizerSpec
from oasr_tinyctc.model import TinyCtcConfig


class TinyCtcConverter(CheckpointConverter):
    architecture = "tinyctc"
    detect_specificity = DETECT_KEYED_VALUE

    def detect(self, path: Path) -> bool:
        cfg = path / "tinyctc.json"
        return cfg.is_file() and json.loads(cfg.read_text()).get("model_type") == "tinyctc"

    def load_state_dict(self, path: Path) -> dict[str, torch.Tensor]:
        return extract_state_dict(load_torch_checkpoint(path / "model.pt"), path / "model.pt")

    def build_config(self, path: Path, state_dict) -> TinyCtcConfig:
        raw = json.loads((path / "tinyctc.json").read_text())
        raw.pop("model_type")
        return serde.structure(raw, TinyCtcConfig, what=str(path / "tinyctc.json"))

    def tokenizer_spec(self, path: Path, config) -> TokenizerSpec:
        return TokenizerSpec(kind="symbol_table", files={"units": str(path / "units.txt")}, special_ids=(0,))

    def feature_spec(self, path: Path, config) -> FeatureSpec:
        return FeatureSpec(kind="kaldi_fbank", num_mel_bins=config.input_dim, audio_scale=32768.0)

    def decoding_defaults(self, path: Path, config) -> DecodingDefaults:
        return DecodingDefaults(decode_type="ctc", blank_id=0)


#: the mean of 32768-scaled Kaldi fbank frames of speech-level audio (about 17 for any of the 80 bins)
FBANK_MEAN = 17.3


def write_checkpoint(path: Path, config: TinyCtcConfig | None = None, *, seed: int = 0) -> Path:
    """Create a random tinyctc checkpoint directory (for tests and the cookbook).

    The default init maps every frame to nearly the same hidden state (the fbank mean dominates), so
    the model would emit one or two tokens whatever it hears.  The input projection is therefore
    centred on the fbank mean and the weights widened, so different audio gives different tokens.
    """
    from oasr_tinyctc.model import TinyCtcModel

    config = config or TinyCtcConfig()
    torch.manual_seed(seed)
    model = TinyCtcModel(config)
    with torch.no_grad():
        weight = model.encoder.input_proj.weight.normal_(0.0, 0.3)
        model.encoder.input_proj.bias.copy_(-weight.sum(dim=1) * FBANK_MEAN)
        model.ctc.weight.normal_(0.0, 1.0)
    path.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), path / "model.pt")
    (path / "tinyctc.json").write_text(json.dumps({"model_type": "tinyctc", **serde.unstructure(config)}))
    units = ["<blank>"] + [chr(ord("a") + i) for i in range(config.vocab_size - 2)] + ["▁"]
    (path / "units.txt").write_text("".join(f"{u} {i}\n" for i, u in enumerate(units)))
    return path
