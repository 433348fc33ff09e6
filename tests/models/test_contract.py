"""Every registered architecture, built tiny on CPU, honours the model contract.

Keyed off ``oasr.list_models()``: a newly registered architecture with no ``tiny()`` config fails
here instead of going uncovered.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import oasr
from oasr import layers, plugins
from oasr.models import BaseAsrModel, BaseEncoder, missing_members
from oasr.models.registry import config_class, model_class
from oasr.models.streaming import STREAMING_PROTOCOLS

# torch.nn modules that do compute with weights: architectures must use the oasr.layers waist instead
BARE_COMPUTE = (nn.Linear, nn.Bilinear, nn.LazyLinear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d,
                nn.ConvTranspose2d, nn.LayerNorm, nn.GroupNorm, nn.BatchNorm1d, nn.BatchNorm2d, nn.Embedding,
                nn.EmbeddingBag, nn.LSTM, nn.GRU, nn.RNN, nn.MultiheadAttention, nn.RMSNorm)


def _waist_types() -> tuple[type, ...]:
    return tuple(getattr(layers, name) for name in layers.__all__ if isinstance(getattr(layers, name), type))


def bare_compute_modules(model: nn.Module) -> list[str]:
    """Names of bare torch.nn compute modules not owned by a waist module."""
    waist = _waist_types()
    offenders = []

    def walk(module: nn.Module, prefix: str) -> None:
        for name, child in module.named_children():
            path = f"{prefix}.{name}" if prefix else name
            if isinstance(child, waist):
                continue  # a waist module may wrap torch internally
            if type(child) in BARE_COMPUTE or (isinstance(child, BARE_COMPUTE) and
                                               not type(child).__module__.startswith("oasr.layers")):
                offenders.append(f"{path} ({type(child).__module__}.{type(child).__name__})")
                continue
            walk(child, path)

    walk(model, "")
    return offenders


def test_the_waist_check_catches_a_bare_layer():
    class Bad(nn.Module):
        def __init__(self):
            super().__init__()
            self.good = layers.Linear(2, 2)
            self.block = nn.Sequential(nn.Linear(2, 2))

    assert bare_compute_modules(Bad()) == ["block.0 (torch.nn.modules.linear.Linear)"]


def _architectures() -> list[str]:
    names = oasr.list_models()
    assert names, "no architecture is registered: the family distributions did not load"
    return names


@pytest.mark.parametrize("name", _architectures())
def test_architecture_builds_tiny_from_the_waist(name):
    cfg_cls = config_class(name)
    try:
        config = cfg_cls.tiny()
    except NotImplementedError:
        pytest.fail(f"architecture {name!r} ({cfg_cls.__name__}) has no tiny() config for the contract tests")
    torch.manual_seed(0)
    model = model_class(name).from_config(config)
    assert isinstance(model, BaseAsrModel)
    assert isinstance(model.encoder, BaseEncoder)
    assert bare_compute_modules(model) == [], f"{name} uses bare torch.nn compute layers"
    caps = model.capabilities
    assert caps, f"{name} serves no decode method"
    distribution = plugins.registry("models").get(name).distribution
    for method in caps:
        strategy = plugins.resolve_decoder(method, distribution).load()
        assert missing_members(model, strategy.requires) == (), f"{name} lacks what {method!r} reads"
    kind = model.encoder.streaming_kind
    assert kind in (*STREAMING_PROTOCOLS, "none")
    if kind == "none":
        assert model.cache_spec is None
    else:
        assert isinstance(model.encoder, STREAMING_PROTOCOLS[kind]), f"{name}: a {kind} encoder without its members"
        streaming = [m for m in caps if plugins.resolve_decoder(m, distribution).load().supports_streaming()]
        assert streaming, f"{name} streams but none of its decode methods has a stream search"
        for method in streaming:
            strategy = plugins.resolve_decoder(method, distribution).load()
            assert missing_members(model, strategy.stream_requires) == ()
    assert isinstance(model.encoder.output_size, int) and model.encoder.output_size > 0
