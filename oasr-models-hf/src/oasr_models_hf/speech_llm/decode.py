"""The ``llm`` decode strategy: a speech LLM's audio tokens prefixed to its causal LM, decoded incrementally.

Per request the prompt is ``<|audio_bos|>`` + one ``<|AUDIO|>`` position per audio token (filled with
the projected tower output) + ``<|audio_eos|>`` + the instruction: ``DecodingOptions.prompt``, else the
checkpoint's ASR instruction (:data:`~oasr_models_hf.speech_llm.config.ASR_INSTRUCTION`), followed by
`` <|xx|>`` when the request names a ``language`` the vocabulary tags.  Generated text is what follows,
up to a stop token (``generation_config.json``'s ``eos_token_id``) or ``max_new_tokens``.

Search per request: greedy (``beam_size`` unset or 1) or transformers' beam search
(:mod:`oasr_models_hf.speech_llm.search`), equal to ``generate(do_sample=False, num_beams=k)``;
``n_best`` returns the best ``n`` finished beams (``num_return_sequences``).

Continuous batching: all active rows (one per greedy request, ``k`` per beam request) advance in one
LM step.  A finished request leaves the batch at once (its rows are dropped by ``select``) and waiting
requests of the batch are prefilled and merged in as rows free up, up to ``max_active_rows``.
"""

from __future__ import annotations

import time
from collections import deque

import attrs
import torch

from oasr.decoding.strategy import DecodeBatch, DecodeContext, DecodeStrategy
from oasr.decoding.types import Hypothesis
from oasr.engine.options import DecodingOptions
from oasr.errors import RequestError
from oasr.models.interfaces import Requirement
from oasr_models_hf.speech_llm.search import BeamSearch, GreedySearch

#: rows whose feature lengths lie within this factor of a group's shortest share one tower pass
PAD_RATIO = 1.25


@attrs.define
class LlmOptions:
    #: tokens a request may generate when it does not say (``DecodingOptions.max_new_tokens``)
    max_new_tokens: int = attrs.field(default=256, validator=attrs.validators.ge(1))
    #: LM rows decoded together; further requests wait and join as rows finish
    max_active_rows: int = attrs.field(default=32, validator=attrs.validators.ge(1))
    #: beam search: score / generated_length ** length_penalty (transformers' default 1.0)
    length_penalty: float = 1.0
    #: beam search: stop once beam_size hypotheses finished (transformers' default False)
    early_stopping: bool = False


@attrs.define(eq=False)
class _Job:
    index: int
    prompt: list[int]
    audio: torch.Tensor
    search: GreedySearch | BeamSearch
    rows: int = 0


class LlmDecodeStrategy(DecodeStrategy):
    family = "llm"
    requires = (
        Requirement("encode_offline", "the audio tower's embeddings are the prompt's audio span"),
        Requirement("config.prompt", "the chat template, language tags and stop ids build and end each prompt"),
        Requirement("language_model.embed", "the prompt's text tokens are embedded around the audio embeddings"),
        Requirement("language_model.prefill", "each prompt is run through the LM in one batched pass"),
        Requirement("language_model.step", "tokens are generated one incremental step at a time"),
        Requirement("language_model.select", "finished rows leave and beams reorder onto their parents"),
        Requirement("language_model.merge", "requests joining mid-decode are merged into the running batch"),
        Requirement("language_model.max_positions", "a prompt plus its new tokens must fit the LM's context"),
    )
    options_class = LlmOptions
    supported_options = frozenset({"language", "beam_size", "n_best", "prompt", "max_new_tokens"})

    def __init__(self, ctx: DecodeContext, options: LlmOptions | None = None):
        super().__init__(ctx, options)
        self.prompt = ctx.model.config.prompt
        self.lm = ctx.model.language_model
        self._languages = {i: code for code, i in self.prompt.languages.items()}

    def validate(self, options: DecodingOptions, request_id: str | None = None) -> None:
        super().validate(options, request_id)
        if options.language is not None and options.language not in self.prompt.languages:
            known = ", ".join(sorted(self.prompt.languages)) or "(none: this vocabulary has no language tags)"
            raise RequestError(f"language {options.language!r} has no tag in this checkpoint's vocabulary; known: "
                               f"{known}", request_id=request_id, param="language")
        if options.n_best > (options.beam_size or 1):
            raise RequestError(f"n_best={options.n_best} needs beam_size >= {options.n_best} (got {options.beam_size})",
                               request_id=request_id, param="n_best")
        limit = self.lm.max_positions // 2
        if options.max_new_tokens is not None and options.max_new_tokens > limit:
            raise RequestError(f"max_new_tokens={options.max_new_tokens} exceeds half the LM's "
                               f"{self.lm.max_positions} positions", request_id=request_id, param="max_new_tokens")

    # -- prompts -----------------------------------------------------------------------------------------
    def instruction(self, options: DecodingOptions) -> str:
        text = options.prompt if options.prompt is not None else self.prompt.instruction
        if options.language is not None:
            text = f"{text} <|{options.language}|>"
        return text

    def prompt_ids(self, audio_tokens: int, options: DecodingOptions) -> list[int]:
        p = self.prompt
        text = self.ctx.tokenizer.encode(self.instruction(options))
        return [p.audio_bos_id] + [p.audio_token_id] * audio_tokens + [p.audio_eos_id] + list(text)

    def _search(self, options: DecodingOptions) -> GreedySearch | BeamSearch:
        limit = options.max_new_tokens or self.options.max_new_tokens
        stops = self.prompt.eos_token_ids
        if (options.beam_size or 1) > 1:
            return BeamSearch(stops, limit, options.beam_size, length_penalty=self.options.length_penalty,
                              early_stopping=self.options.early_stopping)
        return GreedySearch(stops, limit)

    def _prefill(self, jobs: list[_Job]):
        """Left-padded prompts of ``jobs`` → LM state and each job's next-token logits."""
        embed = self.lm.embed
        longest = max(len(j.prompt) for j in jobs)
        device = self.ctx.device
        ids = torch.zeros(len(jobs), longest, dtype=torch.long, device=device)
        valid = torch.zeros(len(jobs), longest, dtype=torch.bool, device=device)
        for r, job in enumerate(jobs):
            ids[r, longest - len(job.prompt):] = torch.tensor(job.prompt, device=device)
            valid[r, longest - len(job.prompt):] = True
        x = embed(ids)
        for r, job in enumerate(jobs):
            slots = (ids[r] == self.prompt.audio_token_id) & valid[r]
            x[r, slots] = job.audio.to(x.dtype)
        budget = max(j.search.max_new for j in jobs)
        return self.lm.prefill(x, valid, capacity=longest + budget + 1)

    # -- the decode loop ---------------------------------------------------------------------------------
    @staticmethod
    def _advance(jobs: list[_Job], logits: torch.Tensor, first: bool) -> tuple[list[_Job], list[int], list[int]]:
        """Advance each job on its rows of ``logits``; (jobs still running, rows they continue, next tokens).

        A just-prefilled job owns one row whatever its beam count (its k beams start identical)."""
        running, keep, tokens = [], [], []
        offset = 0
        for job in jobs:
            n = 1 if first else job.rows
            step = job.search.advance(logits[offset:offset + n])
            if step is not None:
                parents, next_tokens = step
                keep += [offset + (0 if first else p) for p in parents]
                tokens += next_tokens
                job.rows = len(parents)
                running.append(job)
            offset += n
        return running, keep, tokens

    def _run(self, jobs: list[_Job]) -> None:
        waiting: deque[_Job] = deque(jobs)
        active: list[_Job] = []
        state, logits = None, None
        while waiting or active:
            rows = sum(j.rows for j in active)
            admitted: list[_Job] = []
            while waiting and (not (active or admitted) or rows + waiting[0].search.k <= self.options.max_active_rows):
                admitted.append(waiting.popleft())
                rows += admitted[-1].search.k
            active, keep, tokens = self._advance(active, logits, first=False) if active else ([], [], [])
            state = self.lm.select(state, keep) if active else None
            if admitted:
                pstate, plogits = self._prefill(admitted)
                joined, new_keep, new_tokens = self._advance(admitted, plogits, first=True)
                if joined:
                    pstate = self.lm.select(pstate, new_keep)
                    state = pstate if state is None else self.lm.merge(state, pstate)
                    active += joined
                    tokens += new_tokens
            if active:
                logits = self.lm.step(state, torch.tensor(tokens, dtype=torch.long, device=self.ctx.device))

    def encode(self, feats: torch.Tensor, feat_lens: torch.Tensor) -> list[torch.Tensor]:
        """Each row's audio token embeddings (N_i, D).  The tower runs over the longest row of a group,
        so rows are grouped by length (within :data:`PAD_RATIO` of the group's shortest row) and each
        group runs alone: a 2 s request batched with a 9 s one would pay the 9 s tower."""
        order = sorted(range(len(feat_lens)), key=lambda i: int(feat_lens[i]))
        groups: list[list[int]] = []
        for i in order:
            if groups and int(feat_lens[i]) <= PAD_RATIO * max(1, int(feat_lens[groups[-1][0]])):
                groups[-1].append(i)
            else:
                groups.append([i])
        out: list[torch.Tensor | None] = [None] * len(order)
        for group in groups:
            index = torch.tensor(group, device=feats.device)
            audio, counts = self.ctx.model.encode_offline(feats.index_select(0, index), feat_lens[group])
            for r, i in enumerate(group):
                out[i] = audio[r, : int(counts[r])]
        return out  # type: ignore[return-value]

    def decode(self, batch: DecodeBatch) -> list[Hypothesis | BaseException]:
        t0 = time.perf_counter()
        audio = self.encode(batch.feats, batch.feat_lens)
        t1 = time.perf_counter()
        jobs = [_Job(i, self.prompt_ids(len(a), options), a, self._search(options))
                for i, (a, options) in enumerate(zip(audio, batch.options, strict=True))]
        self._run(jobs)
        results: list[Hypothesis | BaseException] = []
        for job in jobs:
            tokens, score = job.search.result()
            options = batch.options[job.index]
            language = options.language or (self._languages.get(tokens[0]) if tokens else None)
            hyp = Hypothesis(tokens=tokens, score=score, language=language)
            if options.n_best > 1:
                hyp.nbest = [Hypothesis(tokens=t, score=v, language=language)
                             for t, v in job.search.results(options.n_best)]
            results.append(hyp)
        batch.timings["encoder"] = t1 - t0
        batch.timings["decode"] = time.perf_counter() - t1
        return results
