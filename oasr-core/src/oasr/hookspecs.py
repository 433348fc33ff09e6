"""The whole OASR plugin contract.

A plugin is a module (or object) with functions marked ``@oasr.hookimpl``, exposed through one of the
entry point groups ``oasr.models``, ``oasr.features`` or ``oasr.kernels``.  Each hook receives a
``register`` callback; calling it records one component and remembers which distribution registered
it.  Register by ``"module:Attr"`` string so that listing what is available imports nothing heavy:
the target is imported the first time it is used.

Core registers its own built-ins through these same hooks (``oasr._builtins``).  A plugin that raises
while importing or registering is skipped with one warning; ``oasr plugins`` shows the error.
"""

from __future__ import annotations

import pluggy

PROJECT = "oasr"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def oasr_register_models(register) -> None:
    """Register model architectures.

    ``register(name, *, model, config, converter=None, description="")``: ``name`` is the registry key
    (``"conformer"``); ``model`` and ``config`` are ``"module:Class"`` strings of a
    :class:`oasr.models.BaseAsrModel` subclass and its attrs config class; ``converter`` optionally
    names a :class:`oasr.checkpoints.CheckpointConverter` subclass that detects and converts the source
    framework's checkpoint directories.  Called once, when the registry is first used.
    """


@hookspec
def oasr_register_aliases(register) -> None:
    """Register model aliases (short names that resolve to a checkpoint directory).

    ``register(name, *, resolver, description="", default=False)``: ``resolver`` is a
    ``"module:function"`` string; the function takes no arguments and returns a local directory path
    (it may download or unpack).  ``default=True`` marks the model used when none is named.
    """


@hookspec
def oasr_register_extractors(register) -> None:
    """Register feature frontends.

    ``register(spec)`` with an :class:`oasr.features.ExtractorSpec`; its callables may be given as
    ``"module:function"`` strings and are imported when an extractor of that kind is built.
    """


@hookspec
def oasr_register_tokenizers(register) -> None:
    """Register tokenizer kinds.

    ``register(kind, target)``: ``target`` is a ``"module:Class"`` string of a tokenizer class whose
    ``from_spec(spec, root)`` builds it from a :class:`oasr.models.TokenizerSpec`.
    """


@hookspec
def oasr_register_decoders(register) -> None:
    """Register decode strategies.

    ``register(name, target)``: ``name`` is a decode family (``"ctc"``, ``"aed"``, ...) and ``target``
    a ``"module:Class"`` string of a decode strategy class (see :mod:`oasr.decoding.strategy`).
    """


@hookspec
def oasr_register_kernels(register) -> None:
    """Register accelerated kernels.

    ``register(name, target)``: ``name`` is a kernel slot of the layer/decoding backend seam (for
    example ``"ctc_prefix_beam_search"``) and ``target`` a ``"module:function"`` string implementing
    it with the same signature and results as the reference.  Core uses a registered kernel
    automatically unless ``OASR_KERNELS=0``.  A slot name ending in ``@cuda`` (``"stft_mel@cuda"``)
    registers the variant used when the data is on a CUDA device.
    """
