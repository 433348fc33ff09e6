"""The ``aed`` decode strategy: Whisper's autoregressive decoding, any audio length, batched.

The strategy reads the batch's waveforms (it computes its own features: the log-mel of the whole
audio followed by 30 s of silence, as openai-whisper's ``transcribe`` does, so audio longer than one
window is decoded in windows) and hands them to :class:`Transcriber`.  Per request it honours
``language`` (detected on multilingual checkpoints when not given), ``task``, ``beam_size`` /
``n_best`` / ``patience`` / ``length_penalty``, ``temperature`` (a tuple is a fallback schedule) with
``best_of`` and the compression-ratio / log-probability / no-speech thresholds,
``condition_on_previous_text``, ``initial_prompt`` (or ``prompt``), ``suppress_tokens``,
``clip_timestamps``, ``max_new_tokens``, ``without_timestamps`` (decode without timestamp tokens),
``timestamps`` (timed segments in the output), ``word_timestamps`` (cross-attention + DTW) and
``hallucination_silence_threshold``.  The defaults decode as openai-whisper's ``transcribe()`` does.
A request with ``batched`` is a chunk of batched long-form, decoded as faster-whisper's
``BatchedInferencePipeline`` decodes one (:mod:`oasr_models_hf.whisper.batched`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import attrs
import torch

from oasr.decoding.strategy import DecodeBatch, DecodeContext, DecodeStrategy
from oasr.decoding.types import Hypothesis
from oasr.engine.options import DecodingOptions
from oasr.errors import RequestError
from oasr.features.whisper import whisper_logmel
from oasr.models.interfaces import Requirement
from oasr_models_hf.whisper.config import SAMPLE_RATE, WINDOW_SECONDS
from oasr_models_hf.whisper.longform import AedOptions, Transcriber


class AedDecodeStrategy(DecodeStrategy):
    family = "aed"
    requires = (
        Requirement("encode_offline", "each 30 s window is encoded once and every decode step attends to it"),
        Requirement("decoder.cross_kv", "the windows' cross-attention K/V are projected once per round"),
        Requirement("decoder.prefill", "the SOT prompt of every window is run in one batched pass"),
        Requirement("decoder.step", "tokens are generated one incremental step at a time"),
        Requirement("decoder.select", "beam search reorders the decoder state onto each beam's parent"),
        Requirement("decoder.logits", "the no-speech probability and each step's scores come from the head"),
        Requirement("decoder.max_positions", "a window's prompt and output must fit the text context"),
        Requirement("decoder.embed_tokens", "the logit rules size their masks by the vocabulary"),
        Requirement("config.generation", "suppression lists, SOT/EOT/timestamp ids and languages drive decoding"),
        Requirement("config.input_frames", "audio is cut into windows of the encoder's fixed input length"),
        Requirement("config.max_source_positions", "timestamp tokens are converted to seek frames by it"),
        Requirement("config.max_target_positions", "max_new_tokens is bounded by half the text context"),
    )
    options_class = AedOptions
    supported_options = frozenset({
        "language", "task", "beam_size", "n_best", "temperature", "prompt", "initial_prompt", "max_new_tokens",
        "timestamps", "without_timestamps", "word_timestamps", "compression_ratio_threshold", "logprob_threshold",
        "no_speech_threshold", "condition_on_previous_text", "suppress_tokens", "clip_timestamps",
        "hallucination_silence_threshold", "best_of", "patience", "length_penalty", "batched"})
    needs_features = False
    supports_long_form = True

    def __init__(self, ctx: DecodeContext, options: AedOptions | None = None):
        super().__init__(ctx, options)
        self.transcriber = Transcriber(ctx.model, ctx.tokenizer, self.options)
        self.gen = ctx.model.config.generation

    @property
    def word_timing_modes(self) -> tuple[str, ...]:
        """``("cross_attention",)`` when the decoder can align words, else ``()``."""
        decoder = self.ctx.model.decoder
        return ("cross_attention",) if hasattr(decoder, "cross_attention") and self.gen.alignment_heads else ()

    def validate(self, options: DecodingOptions, request_id: str | None = None) -> None:
        super().validate(options, request_id)
        gen = self.gen

        def refuse(message: str, param: str) -> None:
            raise RequestError(message, request_id=request_id, param=param)

        if options.language is not None:
            if not gen.is_multilingual and options.language != "en":
                refuse(f"this Whisper checkpoint is English-only; language {options.language!r} is not available",
                       "language")
            if gen.is_multilingual and options.language not in gen.languages:
                refuse(f"language {options.language!r} is not one of this checkpoint's: "
                       f"{', '.join(sorted(gen.languages))}", "language")
        if options.task == "translate" and (not gen.is_multilingual or gen.translate_id is None):
            refuse("this Whisper checkpoint is English-only and cannot translate", "task")
        if options.n_best > (options.beam_size or 1):
            refuse(f"n_best={options.n_best} needs beam_size >= {options.n_best} (got {options.beam_size})", "n_best")
        if options.word_timestamps and not self.word_timing_modes:
            refuse("this checkpoint declares no alignment heads, so it cannot time words", "word_timestamps")
        if any(t < 0 for t in options.temperature):
            refuse(f"temperatures must be >= 0, got {options.temperature}", "temperature")
        if options.prompt and options.initial_prompt and options.prompt != options.initial_prompt:
            refuse("prompt and initial_prompt are the same option; give one", "initial_prompt")
        if options.hallucination_silence_threshold is not None and not options.word_timestamps:
            refuse("hallucination_silence_threshold works on word timings; it needs word_timestamps=True",
                   "hallucination_silence_threshold")
        clips = options.clip_timestamps
        if any(t < 0 for t in clips) or any(b <= a for a, b in zip(clips[::2], clips[1::2], strict=False)):
            refuse(f"clip_timestamps must be non-negative start,end pairs with end > start, got {clips}",
                   "clip_timestamps")
        if options.patience is not None and options.patience <= 0:
            refuse(f"patience must be > 0, got {options.patience}", "patience")
        vocab = self.ctx.model.config.vocab_size
        if any(t < -1 or t >= vocab for t in options.suppress_tokens):
            refuse(f"suppress_tokens must be token ids below {vocab} (or -1), got {options.suppress_tokens}",
                   "suppress_tokens")
        if options.batched:
            from oasr_models_hf.whisper.batched import check_options

            check_options(options, request_id)
        limit = self.ctx.model.config.max_target_positions // 2
        if options.max_new_tokens is not None and options.max_new_tokens > limit:
            refuse(f"max_new_tokens={options.max_new_tokens} exceeds Whisper's {limit} tokens per window",
                   "max_new_tokens")

    def plan_options(self, options: DecodingOptions, pieces: Iterable[torch.Tensor]) -> DecodingOptions:
        """Batched long-form on a multilingual checkpoint without a language: the language detected once
        for the request's chunks (faster-whisper's batched pipeline), so every chunk is decoded in it."""
        if not options.batched or options.language is not None or not self.gen.is_multilingual:
            return options
        from oasr_models_hf.whisper.batched import request_language

        with torch.inference_mode():
            return attrs.evolve(options, language=request_language(self.transcriber, pieces))

    def log_mels(self, waveforms: list[torch.Tensor]) -> list[torch.Tensor]:
        """Per request: the log-mel (n_mels, frames) of its audio followed by 30 s of silence (the
        silence is not copied onto the audio: a long recording is held once).

        One row at a time: rows of very different lengths padded into one batch would spend most of
        the transform on padding (the max-norm is per row anyway).
        """
        pad = WINDOW_SECONDS * SAMPLE_RATE
        n_mels = self.ctx.model.config.num_mel_bins
        out = []
        for wave in waveforms:
            wave = wave.reshape(-1).float().to(self.ctx.device)
            feats, counts = whisper_logmel(wave[None], torch.tensor([wave.numel()]), num_mels=n_mels,
                                           padding_samples=pad)
            out.append(feats[0, : int(counts[0])].t())
        return out

    def decode(self, batch: DecodeBatch) -> list[Hypothesis | BaseException]:
        if any(o.batched for o in batch.options):
            return self._decode_chunks(batch)
        t0 = time.perf_counter()
        mels = self.log_mels(batch.waveforms)
        t1 = time.perf_counter()
        with torch.inference_mode():
            results = self.transcriber.run(mels, batch.options, on_segments=batch.on_segments)
        encoder = self.transcriber.encoder_seconds
        batch.timings["features"] = batch.timings.get("features", 0.0) + (t1 - t0)
        batch.timings["encoder"] = encoder
        batch.timings["decode"] = time.perf_counter() - t1 - encoder
        return results

    def _decode_chunks(self, batch: DecodeBatch) -> list[Hypothesis | BaseException]:
        """Batched long-form chunks decoded together, any other rows of the batch as usual."""
        from oasr_models_hf.whisper.batched import decode_chunks

        chunks = [i for i, o in enumerate(batch.options) if o.batched]
        rest = [i for i, o in enumerate(batch.options) if not o.batched]
        t0 = time.perf_counter()
        self.transcriber.encoder_seconds = 0.0
        with torch.inference_mode():
            decoded = decode_chunks(self.transcriber, [batch.waveforms[i] for i in chunks],
                                    [batch.options[i] for i in chunks])
            encoder = self.transcriber.encoder_seconds
            others = []
            if rest:
                mels = self.log_mels([batch.waveforms[i] for i in rest])
                on_segments = None
                if batch.on_segments is not None:
                    def on_segments(row, *args):
                        return batch.on_segments(rest[row], *args)
                others = self.transcriber.run(mels, [batch.options[i] for i in rest], on_segments=on_segments)
                encoder += self.transcriber.encoder_seconds
        results: list[Hypothesis | BaseException | None] = [None] * len(batch.options)
        for i, r in zip(chunks + rest, list(decoded) + list(others), strict=True):
            results[i] = r
        batch.timings["encoder"] = encoder
        batch.timings["decode"] = time.perf_counter() - t0 - encoder
        return results  # type: ignore[return-value]
