"""Hook implementations of oasr-kernels (registers by string; numba is imported on first use).

A slot named ``name@cuda`` is the variant core uses when the tensor it works on is on a CUDA device
(see :func:`oasr.layers._backend.kernel`).
"""

from __future__ import annotations

from oasr.hookspecs import hookimpl


@hookimpl
def oasr_register_kernels(register) -> None:
    """CTC prefix beam search, few-row linears, the fused decoder layer, the vocabulary screen's kernels and an int8
    attention core (numba, CPU); the GPU feature chain and searches (numba.cuda)."""
    register("ctc_prefix_beam_search", "oasr_kernels.ctc:ctc_prefix_beam_search")
    register("row_linear", "oasr_kernels.rows:row_linear")
    register("decoder_layer_rows", "oasr_kernels.decoder_rows:decoder_layer_rows")
    register("screen_resolve_row", "oasr_kernels.screen:screen_resolve_row")
    register("screen_table_terms", "oasr_kernels.screen:screen_table_terms")
    register("int8_attention", "oasr_kernels.attention:int8_attention")
    register("int8_linear", "oasr_kernels.int8_linear:int8_linear")
    register("ctc_prefix_beam_state", "oasr_kernels.ctc:PrefixBeamState")
    register("stft_mel@cuda", "oasr_kernels.cuda.features:stft_mel")
    register("ctc_greedy_search@cuda", "oasr_kernels.cuda.ctc:ctc_greedy_search")
    register("ctc_prefix_beam_search@cuda", "oasr_kernels.cuda.beam:ctc_prefix_beam_search")
    register("transducer_greedy_search@cuda", "oasr_kernels.cuda.transducer:transducer_greedy_search")
