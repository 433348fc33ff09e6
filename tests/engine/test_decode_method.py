"""How the engine picks a model's decode strategy: the checkpoint's default, the model's declared
methods, a distribution's own namespaced strategy, and each strategy's declared requirements."""

from __future__ import annotations

import attrs
import pytest

from oasr import hookimpl, plugins
from oasr.checkpoints.loading import load_pretrained
from oasr.decoding.ctc_strategy import CtcDecodeStrategy
from oasr.engine import Engine
from oasr.errors import CapabilityError
from oasr.models.interfaces import Requirement


class RivalCtc(CtcDecodeStrategy):
    """Another distribution's strategy registered under the name core's CTC strategy holds."""


class NeedsAHead(CtcDecodeStrategy):
    family = "needs_a_head"
    requires = (Requirement("rescoring_head.score", "the toy rescoring pass reads it"),)


class Rival:
    @hookimpl
    def oasr_register_models(self, register):
        register("rivalctc", model="oasr_tinyctc.model:TinyCtcModel", config="oasr_tinyctc.model:TinyCtcConfig",
                 converter="oasr_tinyctc.convert:TinyCtcConverter")

    @hookimpl
    def oasr_register_decoders(self, register):
        register("ctc", "tests.engine.test_decode_method:RivalCtc")


def test_the_default_method_is_the_checkpoints(tinyctc_dir):
    loaded = load_pretrained(tinyctc_dir)
    assert loaded.decoding_defaults.decode_type == "ctc"
    assert Engine(loaded=loaded).decode_method == "ctc"
    loaded.decoding_defaults = attrs.evolve(loaded.decoding_defaults, decode_type="framewise")
    with pytest.raises(CapabilityError, match="'framewise' is not served by this tinyctc checkpoint; it serves: ctc"):
        Engine(loaded=loaded)


def test_a_distribution_decodes_its_models_with_its_own_namespaced_strategy(tinyctc_dir):
    with pytest.warns(RuntimeWarning, match="'ctc' is taken by 'oasr-core': kept as 'oasr-rival:ctc'"):
        plugins.register_plugin(Rival(), name="rival", distribution="oasr-rival")
    try:
        rival = Engine(loaded=load_pretrained(tinyctc_dir, architecture="rivalctc"))
        assert type(rival.strategy) is RivalCtc and rival.decode_method == "ctc"
        own = Engine(loaded=load_pretrained(tinyctc_dir, architecture="tinyctc"))  # another distribution: core ctc
        assert type(own.strategy) is CtcDecodeStrategy
        explicit = Engine(loaded=load_pretrained(tinyctc_dir, architecture="tinyctc"), decode_method="oasr-rival:ctc")
        assert type(explicit.strategy) is RivalCtc
    finally:
        plugins.unregister_plugin("rival")


def test_a_strategy_requirement_the_model_lacks_fails_at_construction_naming_it_and_why(tinyctc_dir, monkeypatch):
    loaded = load_pretrained(tinyctc_dir)
    plugins.registry("decoders").add("needs_a_head", NeedsAHead, distribution="tests")
    try:
        monkeypatch.setattr(type(loaded.model), "capabilities", property(lambda self: frozenset({"ctc", "needs_a_head"})))
        with pytest.raises(CapabilityError, match=r"TinyCtcModel cannot decode with decode method 'needs_a_head': "
                                                  r"it lacks rescoring_head.score \(the toy rescoring pass reads it\)"):
            Engine(loaded=loaded, decode_method="needs_a_head")
    finally:
        plugins.registry("decoders").remove("needs_a_head")
