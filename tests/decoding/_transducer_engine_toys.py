"""``toytransducer``: the example family's causal toy encoder (slot streaming) with a label-window
predictor and a joiner on top, decoded by core's ``transducer`` family — an architecture of the tests'
own, registered in-process by :func:`toytransducer_registered`."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from oasr import serde
from oasr.models import DecodingDefaults
from tests.decoding._transducer_toys import ToyJoiner, WindowPredictor
from tests.helpers import TOYFAMILY_SRC, registered_model

if str(TOYFAMILY_SRC) not in __import__("sys").path:
    __import__("sys").path.insert(0, str(TOYFAMILY_SRC))

from oasr_toyfamily.convert import ToyFrameConverter  # noqa: E402
from oasr_toyfamily.model import ToyFrameConfig, ToyFrameModel  # noqa: E402

MODULE = "tests.decoding._transducer_engine_toys"


class ToyTransducer(ToyFrameModel):
    """The toy encoder, a stateless predictor (context 2) and a joiner; blank is class 0."""

    def __init__(self, config: ToyFrameConfig):
        super().__init__(config)
        self.predictor = WindowPredictor(config.vocab_size, dim=8, context_size=2, seed=31, scale=1.0)
        self.joiner = ToyJoiner(config.widths[-1], 8, config.vocab_size, joiner_dim=16, seed=32, scale=0.5)

    @property
    def capabilities(self) -> frozenset[str]:
        return frozenset({"transducer"})


class ToyTransducerConverter(ToyFrameConverter):
    architecture = "toytransducer"

    def detect(self, path: Path) -> bool:
        cfg = path / "toyframe.json"
        return cfg.is_file() and json.loads(cfg.read_text()).get("model_type") == "toytransducer"

    def build_config(self, path: Path, state_dict) -> ToyFrameConfig:
        raw = json.loads((path / "toyframe.json").read_text())
        raw.pop("model_type")
        return serde.structure(raw, ToyFrameConfig, what=str(path / "toyframe.json"))

    def decoding_defaults(self, path: Path, config) -> DecodingDefaults:
        return DecodingDefaults(decode_type="transducer", blank_id=0)


def toytransducer_registered():
    return registered_model("toytransducer", f"{MODULE}:ToyTransducer", "oasr_toyfamily.model:ToyFrameConfig",
                            f"{MODULE}:ToyTransducerConverter")


def write_checkpoint(path: Path, *, seed: int = 0, blank_bias: float = 1.0, enc_scale: float = 3.0,
                     pred_scale: float = 0.5) -> Path:
    config = ToyFrameConfig(streaming_kind="slot")
    torch.manual_seed(seed)
    model = ToyTransducer(config)
    with torch.no_grad():
        model.encoder.input_proj.weight.normal_(0.0, 0.3)
        model.joiner.out.weight.mul_(2.0)
        model.joiner.enc.weight.mul_(enc_scale)
        model.joiner.pred.weight.mul_(pred_scale)
        model.joiner.out.bias[0] += blank_bias
    path.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), path / "model.pt")
    (path / "toyframe.json").write_text(json.dumps({"model_type": "toytransducer", **serde.unstructure(config)}))
    units = ["<blk>"] + [chr(ord("a") + i) for i in range(config.vocab_size - 1)]
    (path / "units.txt").write_text("".join(f"{u} {i}\n" for i, u in enumerate(units)))
    return path
