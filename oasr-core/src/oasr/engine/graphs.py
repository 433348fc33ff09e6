"""CUDA-graph capture of the streaming chunk step, one graph per batch size.

A streaming step runs the same kernels every chunk; on a GPU the launches, not the math, dominate a
small cohort's step, and replaying a captured CUDA graph removes them.  A graph bakes in every
address it reads, so a step is captured only when everything it reads lives at a stable address or
is copied into the graph's static input buffers first:

- the encoder declares it (``BaseEncoder.supports_step_graphs``): its chunk forward has no host
  synchronisation and no shape that depends on tensor values;
- the backend keeps state the graph can read: ``slot`` state is gathered into fixed-shape tensors
  per cohort (the gather and scatter stay outside the graph), so each batch size is one graph;
- ``paged`` state is refused: the backend gathers a dense K/V view whose width follows each stream's
  history, so a graph would read a buffer of the batch it was captured on;
- ``stateful`` encoders keep dense per-stream state they allocate themselves: refused.

``EngineConfig.cuda_graphs=False`` switches capture off.  On the CPU there is nothing to capture.
A capture that fails (an encoder that over-declared) leaves that batch size eager, with a warning.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

#: eager runs on a side stream before a capture (cuBLAS/cuDNN pick their algorithms there)
WARMUP_RUNS = 2


def graph_refusal(*, enabled: bool, device: torch.device, streaming_kind: str, encoder: Any) -> str | None:
    """Why the streaming step of ``encoder`` is not captured, or None when it is."""
    if not enabled:
        return "EngineConfig.cuda_graphs is False"
    if device.type != "cuda":
        return f"CUDA graphs need a CUDA device (the engine runs on {device.type})"
    if not encoder.supports_step_graphs:
        return f"{type(encoder).__name__} does not declare supports_step_graphs"
    if streaming_kind == "stateful":
        return "a 'stateful' encoder allocates its own dense per-stream state, which a graph cannot read"
    if streaming_kind == "paged":
        return ("the paged backend gathers a dense K/V view whose width follows each stream's history; "
                "a graph would read the buffer of the batch it was captured on")
    if streaming_kind != "slot":
        return f"streaming_kind {streaming_kind!r} has no capturable step"
    return None


def _flatten(tree: Any, out: list[torch.Tensor]) -> Any:
    """``tree`` with each tensor replaced by its index in ``out`` (tensors, tuples, lists, dicts)."""
    if isinstance(tree, torch.Tensor):
        out.append(tree)
        return len(out) - 1
    if isinstance(tree, dict):
        return {k: _flatten(v, out) for k, v in tree.items()}
    if isinstance(tree, (tuple, list)):
        return type(tree)(_flatten(v, out) for v in tree)
    raise TypeError(f"a captured step takes and returns tensors, tuples, lists and dicts, not {type(tree).__name__}")


def _unflatten(spec: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(spec, int):
        return tensors[spec]
    if isinstance(spec, dict):
        return {k: _unflatten(v, tensors) for k, v in spec.items()}
    return type(spec)(_unflatten(v, tensors) for v in spec)


class _Graph:
    def __init__(self, fn: Callable[..., Any], args: tuple):
        inputs: list[torch.Tensor] = []
        self.in_spec = _flatten(args, inputs)
        self.static_in = [t.clone() for t in inputs]
        static_args = _unflatten(self.in_spec, self.static_in)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                fn(*static_args)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            out = fn(*static_args)
        outputs: list[torch.Tensor] = []
        self.out_spec = _flatten(out, outputs)
        self.static_out = outputs

    def replay(self, args: tuple) -> Any:
        inputs: list[torch.Tensor] = []
        _flatten(args, inputs)
        for static, value in zip(self.static_in, inputs, strict=True):
            static.copy_(value)
        self.graph.replay()
        # the caller keeps results across steps: hand out copies, the static outputs are rewritten
        return _unflatten(self.out_spec, [t.clone() for t in self.static_out])


class StepGraphs:
    """``fn(*args)`` replayed from a CUDA graph per input signature (in practice: per batch size)."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn
        self.graphs: dict[tuple, _Graph | None] = {}

    @staticmethod
    def signature(args: tuple) -> tuple:
        inputs: list[torch.Tensor] = []
        spec = _flatten(args, inputs)
        return repr(spec), tuple((tuple(t.shape), t.dtype, t.device) for t in inputs)

    def __call__(self, *args: Any) -> Any:
        key = self.signature(args)
        if key not in self.graphs:
            try:
                self.graphs[key] = _Graph(self.fn, args)
            except Exception as exc:  # an encoder that cannot be captured runs eagerly for this shape
                warnings.warn(f"CUDA graph capture of the streaming step failed ({type(exc).__name__}: {exc}); "
                              f"this batch size runs eagerly", RuntimeWarning, stacklevel=2)
                self.graphs[key] = None
        graph = self.graphs[key]
        return self.fn(*args) if graph is None else graph.replay(args)

    @property
    def captured(self) -> int:
        return sum(1 for g in self.graphs.values() if g is not None)
