"""The toyframe checkpoint format: ``toyframe.json`` (config), ``model.pt`` (state dict), ``units.txt``."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from oasr import serde
from oasr.checkpoints import DETECT_KEYED_VALUE, CheckpointConverter, extract_state_dict, load_torch_checkpoint
from oasr.models import DecodingDefaults, FeatureSpec, TokenizerSpec
from oasr_toyfamily.model import ToyFrameConfig


class ToyFrameConverter(CheckpointConverter):
    architecture = "toyframe"
    detect_specificity = DETECT_KEYED_VALUE

    def detect(self, path: Path) -> bool:
        cfg = path / "toyframe.json"
        return cfg.is_file() and json.loads(cfg.read_text()).get("model_type") == "toyframe"

    def load_state_dict(self, path: Path) -> dict[str, torch.Tensor]:
        return extract_state_dict(load_torch_checkpoint(path / "model.pt"), path / "model.pt")

    def build_config(self, path: Path, state_dict) -> ToyFrameConfig:
        raw = json.loads((path / "toyframe.json").read_text())
        raw.pop("model_type")
        return serde.structure(raw, ToyFrameConfig, what=str(path / "toyframe.json"))

    def tokenizer_spec(self, path: Path, config) -> TokenizerSpec:
        return TokenizerSpec(kind="symbol_table", files={"units": str(path / "units.txt")}, special_ids=(0,))

    def feature_spec(self, path: Path, config) -> FeatureSpec:
        return FeatureSpec(kind="kaldi_fbank", num_mel_bins=config.input_dim, audio_scale=32768.0)

    def decoding_defaults(self, path: Path, config) -> DecodingDefaults:
        return DecodingDefaults(decode_type="framewise")


def write_checkpoint(path: Path, config: ToyFrameConfig | None = None, *, seed: int = 0) -> Path:
    """A random toyframe checkpoint directory; weights widened so different audio gives different tokens."""
    from oasr_toyfamily.model import ToyFrameModel

    config = config or ToyFrameConfig()
    torch.manual_seed(seed)
    model = ToyFrameModel(config)
    with torch.no_grad():
        model.encoder.input_proj.weight.normal_(0.0, 0.3)
        model.classifier.weight.normal_(0.0, 1.0)
    path.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), path / "model.pt")
    (path / "toyframe.json").write_text(json.dumps({"model_type": "toyframe", **serde.unstructure(config)}))
    units = ["<sil>"] + [chr(ord("a") + i) for i in range(config.vocab_size - 1)]
    (path / "units.txt").write_text("".join(f"{u} {i}\n" for i, u in enumerate(units)))
    return path
