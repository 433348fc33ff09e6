"""The ``paraformer`` decode strategy: one non-autoregressive pass, greedy over the decoder posteriors.

Per batch: the SANM encoder, the CIF predictor (token count = ``round(floor(sum alphas))`` with the
tail frame), one decoder pass over the fired acoustic embeddings, then per row the argmax of each
token position, dropping blank / ``<s>`` / ``</s>`` — FunASR's ``Paraformer.inference`` without an
LM or CTC beam.

Token times follow FunASR's ``ts_prediction_lfr6_standard`` (:mod:`oasr_models_funasr.timestamps`):
from the BiCif timestamp head's upsampled alphas when the checkpoint has one (what FunASR prints by
default), else from the predictor's own alphas (what a plain Paraformer prints with
``output_timestamp=True``).  ``Hypothesis.token_times`` / ``token_end_times`` are those milliseconds
in seconds; ``word_timestamps`` groups them into :attr:`RequestOutput.words`.

Audio longer than ``max_audio_seconds`` (default :data:`MAX_AUDIO_SECONDS`, about what FunASR's
AutoModel runs in one pass before its users put a VAD in front) fails that request with a clear
error: nothing is truncated.
"""

from __future__ import annotations

import math
import time

import attrs
import torch

from oasr.decoding.strategy import DecodeBatch, DecodeContext, DecodeStrategy
from oasr.decoding.types import Hypothesis, WordTiming
from oasr.errors import RequestError
from oasr.models.interfaces import Requirement
from oasr_models_funasr.timestamps import token_timestamps
from oasr_models_funasr.words import funasr_words

#: the longest audio decoded in one pass; longer audio is refused until it is VAD-segmented
MAX_AUDIO_SECONDS = 60.0


@attrs.define
class ParaformerOptions:
    #: audio longer than this many seconds is refused (the model attends over the whole utterance)
    max_audio_seconds: float = attrs.field(default=MAX_AUDIO_SECONDS, validator=attrs.validators.gt(0))


def refuse_long(batch: DecodeBatch, limit: float, sample_rate: int,
                what: str) -> tuple[list[Hypothesis | BaseException | None], list[int]]:
    """(per-row results with an error for each row longer than ``limit`` seconds, the other rows)."""
    results: list[Hypothesis | BaseException | None] = [None] * len(batch)
    rows = []
    for i, (rid, wave) in enumerate(zip(batch.request_ids, batch.waveforms, strict=True)):
        seconds = wave.numel() / sample_rate
        if seconds > limit + 1e-6:
            results[i] = RequestError(
                f"request {rid}: audio is {seconds:.1f} s, longer than the {limit:g} s {what} decodes in one pass "
                f"(decode option max_audio_seconds); split it (for example with a VAD) before transcribing",
                request_id=rid, param="file")
        else:
            rows.append(i)
    return results, rows


class ParaformerDecodeStrategy(DecodeStrategy):
    family = "paraformer"
    requires = (
        Requirement("recognize", "one pass runs the encoder, the CIF predictor and the NAR decoder over the batch "
                                 "(ParaformerOutput: token posteriors, counts and the alphas token times come from)"),
    )
    options_class = ParaformerOptions
    supported_options = frozenset({"word_timestamps", "timestamps"})

    def __init__(self, ctx: DecodeContext, options: ParaformerOptions | None = None):
        super().__init__(ctx, options)
        defaults = ctx.decoding_defaults
        self.dropped = {int(i) for i in (defaults.blank_id, defaults.sos_id, defaults.eos_id) if i is not None}

    def decode(self, batch: DecodeBatch) -> list[Hypothesis | BaseException]:
        results, rows = refuse_long(batch, self.options.max_audio_seconds, self.ctx.sample_rate, "this Paraformer")
        if not rows:
            return results  # type: ignore[return-value]
        device = self.ctx.device
        index = torch.tensor(rows)
        t0 = time.perf_counter()
        feats = batch.feats.index_select(0, index).to(device)
        lens = batch.feat_lens.index_select(0, index).to(device)
        with torch.inference_mode():
            out = self.ctx.model.recognize(feats, lens)
            timing = self._timing_alphas(out) if self._wants_times(batch, rows) else None
        t1 = time.perf_counter()
        for k, row in enumerate(rows):
            results[row] = self._hypothesis(out, k, timing, batch.options[row])
        batch.timings["encoder"] = t1 - t0
        batch.timings["decode"] = time.perf_counter() - t1
        return results  # type: ignore[return-value]

    def _wants_times(self, batch: DecodeBatch, rows: list[int]) -> bool:
        """BiCif transcripts are always timed (FunASR prints them spaced by word); a plain Paraformer
        only when a request asks."""
        if self.ctx.model.config.has_timestamp_head:
            return True
        return any(batch.options[r].word_timestamps for r in rows)

    def _timing_alphas(self, out):
        """(alphas, peaks, frames per row, upsample rate) that FunASR's timestamp rules read."""
        model = self.ctx.model
        if model.config.has_timestamp_head:
            up = model.config.predictor.upsample_times
            alphas, peaks = model.predictor.upsampled_alphas(out.hidden, out.hidden_lens, out.token_lens)
            return alphas, peaks, out.hidden_lens * up, up
        # a plain Paraformer hands FunASR's rules its fires as alphas and its alphas as peaks
        steps = out.hidden_lens + (1 if model.config.predictor.tail_threshold > 0 else 0)
        return out.fires, out.alphas, steps, 1

    def _hypothesis(self, out, k: int, timing, options) -> Hypothesis:
        n = int(out.token_lens[k])
        scores = out.log_probs[k, :n].float()
        best, ids = scores.max(-1) if n else (scores.new_zeros(0), scores.new_zeros(0, dtype=torch.long))
        keep = [j for j, t in enumerate(ids.tolist()) if t not in self.dropped]
        tokens = [int(ids[j]) for j in keep]
        confidences = [math.exp(float(best[j])) for j in keep]
        hyp = Hypothesis(tokens=tokens, score=float(best.sum()), token_confidences=confidences,
                         confidence=math.exp(float(best[keep].mean())) if keep else None)
        if timing is not None and tokens:
            alphas, peaks, steps, up = timing
            length = int(steps[k])
            spans = token_timestamps(alphas[k, :length], peaks[k, :length], len(tokens), upsample_rate=up)
            self._attach_times(hyp, spans, options)
        return hyp

    def _attach_times(self, hyp: Hypothesis, spans: list[tuple[int, int]], options) -> None:
        """Token times, FunASR's word items and (for BiCif, as FunASR prints it) the space-joined text."""
        if len(spans) != len(hyp.tokens):
            return  # the fires could not be matched to the tokens: FunASR has no timestamps either
        hyp.token_times = [s / 1000.0 for s, _ in spans]
        hyp.token_end_times = [e / 1000.0 for _, e in spans]
        pieces = [self.ctx.tokenizer.id_to_piece(t) for t in hyp.tokens]
        words, times = funasr_words(pieces, [list(span) for span in spans])
        if self.ctx.model.config.has_timestamp_head:
            hyp.text = " ".join(words).strip()
        if options.word_timestamps and len(words) == len(times):
            hyp.words = [WordTiming(word, s / 1000.0, e / 1000.0) for word, (s, e) in zip(words, times, strict=True)]


@attrs.define
class SenseVoiceOptions:
    #: inverse text normalization query (FunASR's ``use_itn``: ``withitn`` instead of ``woitn``)
    use_itn: bool = False
    #: audio longer than this many seconds is refused (the model attends over the whole utterance)
    max_audio_seconds: float = attrs.field(default=MAX_AUDIO_SECONDS, validator=attrs.validators.gt(0))


class SenseVoiceDecodeStrategy(DecodeStrategy):
    """``sensevoice``: greedy CTC over SenseVoice's output (FunASR's ``SenseVoiceSmall.inference``).

    ``DecodingOptions.language`` picks the language query (``auto`` when unset; a code FunASR does not
    know is refused at admission).  The tags the model emits are taken out of the transcript: the
    first language tag becomes ``RequestOutput.language``, the first emotion, event and text-norm tags
    ``RequestOutput.tags`` (``{"emotion": "NEUTRAL", "event": "Speech", "text_norm": "woitn"}``).
    """

    family = "sensevoice"
    requires = (
        Requirement("encode_offline", "the language and text-norm queries are prepended to each row's features"),
        Requirement("ctc_log_probs", "greedy CTC over the projection emits the tags, then the transcript"),
    )
    options_class = SenseVoiceOptions
    supported_options = frozenset({"language", "timestamps"})

    def __init__(self, ctx: DecodeContext, options: SenseVoiceOptions | None = None):
        super().__init__(ctx, options)
        from oasr_models_funasr.sensevoice import TAG_CLASSES

        blank = ctx.decoding_defaults.blank_id
        self.blank_id = int(blank if blank is not None else 0)
        by_piece = {f"<|{name}|>": (cls, name) for cls, names in TAG_CLASSES.items() for name in names}
        tokenizer = ctx.tokenizer
        self.tag_of = {i: by_piece[tokenizer.id_to_piece(i)] for i in range(tokenizer.vocab_size)
                       if tokenizer.id_to_piece(i) in by_piece}

    def validate(self, options, request_id: str | None = None) -> None:
        from oasr_models_funasr.sensevoice import LANGUAGE_QUERIES

        super().validate(options, request_id)
        if options.language is not None and options.language not in LANGUAGE_QUERIES:
            raise RequestError(f"SenseVoice has no language query {options.language!r}; choose one of "
                               f"{', '.join(LANGUAGE_QUERIES)}", request_id=request_id, param="language")

    def decode(self, batch: DecodeBatch) -> list[Hypothesis | BaseException]:
        from oasr_models_funasr.sensevoice import LANGUAGE_QUERIES, TEXT_NORM_QUERIES

        results, rows = refuse_long(batch, self.options.max_audio_seconds, self.ctx.sample_rate, "SenseVoice")
        if not rows:
            return results  # type: ignore[return-value]
        device = self.ctx.device
        index = torch.tensor(rows)
        languages = torch.tensor([LANGUAGE_QUERIES[batch.options[r].language or "auto"] for r in rows], device=device)
        norm = TEXT_NORM_QUERIES["withitn" if self.options.use_itn else "woitn"]
        t0 = time.perf_counter()
        with torch.inference_mode():
            model = self.ctx.model
            hidden, lens = model.encode_offline(batch.feats.index_select(0, index).to(device),
                                                batch.feat_lens.index_select(0, index).to(device), languages, norm)
            log_probs = model.ctc_log_probs(hidden).cpu()
        t1 = time.perf_counter()
        for k, row in enumerate(rows):
            results[row] = self._hypothesis(log_probs[k, :int(lens[k])])
        batch.timings["encoder"] = t1 - t0
        batch.timings["decode"] = time.perf_counter() - t1
        return results  # type: ignore[return-value]

    def _hypothesis(self, log_probs: torch.Tensor) -> Hypothesis:
        best, path = log_probs.max(-1)
        ids = torch.unique_consecutive(path).tolist()
        ids = [t for t in ids if t != self.blank_id]
        tags: dict[str, str] = {}
        for t in ids:
            if t in self.tag_of:
                cls, name = self.tag_of[t]
                tags.setdefault(cls, name)
        tokens = [t for t in ids if t not in self.tag_of]
        language = tags.pop("language", None)
        return Hypothesis(tokens=tokens, score=float(best.sum()), language=language, tags=tags or None,
                          confidence=math.exp(float(best.mean())) if best.numel() else None)
