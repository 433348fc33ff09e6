"""Hook implementations of oasr-kernels (registers by string; numba is imported on first use)."""

from __future__ import annotations

from oasr.hookspecs import hookimpl


@hookimpl
def oasr_register_kernels(register) -> None:
    """CTC prefix beam search: the batched offline search and the per-stream state."""
    register("ctc_prefix_beam_search", "oasr_kernels.ctc:ctc_prefix_beam_search")
    register("ctc_prefix_beam_state", "oasr_kernels.ctc:PrefixBeamState")
