"""Core's built-in components, registered through the same hooks as any plugin."""

from __future__ import annotations

from oasr.hookspecs import hookimpl


@hookimpl
def oasr_register_extractors(register) -> None:
    from oasr.features.extractors import builtin_extractors

    for spec in builtin_extractors():
        register(spec)


@hookimpl
def oasr_register_tokenizers(register) -> None:
    register("symbol_table", "oasr.tokenizers.symbol_table:SymbolTableTokenizer")
    register("sentencepiece", "oasr.tokenizers.sentencepiece:SentencePieceTokenizer")
    register("huggingface", "oasr.tokenizers.huggingface:HuggingFaceTokenizer")
    register("whisper", "oasr.tokenizers.whisper:WhisperTokenizer")
    register("funasr_char", "oasr.tokenizers.funasr_char:FunAsrCharTokenizer")


@hookimpl
def oasr_register_decoders(register) -> None:
    register("ctc", "oasr.decoding.ctc_strategy:CtcDecodeStrategy")
    register("transducer", "oasr.decoding.transducer_strategy:TransducerDecodeStrategy")
