"""The ``framewise`` decode family: every encoder frame is classified; a run of one class is one token.

Class 0 is silence.  The strategy declares what it reads of the model, and its stream search applies
the classifier to each chunk's encoder frames itself: nothing in the engine knows this head.
"""

from __future__ import annotations

import time

import torch

from oasr.decoding.strategy import DecodeBatch, DecodeStrategy
from oasr.decoding.types import Hypothesis
from oasr.errors import RequestError
from oasr.models.interfaces import Requirement


class FramewiseStrategy(DecodeStrategy):
    family = "framewise"
    requires = (
        Requirement("encode", "each request is encoded with its own prompt (its language)"),
        Requirement("encoder.language_id", "a request's language selects the encoder's prompt"),
        Requirement("classifier", "each encoder frame is classified on its own"),
    )
    stream_requires = (Requirement("classifier", "each chunk's encoder frames are classified as they arrive"),)

    def validate(self, options, request_id=None) -> None:
        super().validate(options, request_id)
        languages = self.ctx.model.config.languages
        if options.language is not None and options.language not in languages:
            raise RequestError(f"language {options.language!r} is not one of this model's: {', '.join(languages)}",
                               request_id=request_id, param="language")

    def decode(self, batch: DecodeBatch) -> list[Hypothesis | BaseException]:
        model = self.ctx.model
        t0 = time.perf_counter()
        prompts = torch.tensor([model.encoder.language_id(o.language) for o in batch.options], device=self.ctx.device)
        hidden, lens = model.encode(batch.feats, batch.feat_lens, prompts)
        classes = model.classifier(hidden).argmax(-1).cpu()
        t1 = time.perf_counter()
        out = []
        for row in range(len(batch)):
            search = FramewiseSearch(model)
            search.add(classes[row, : int(lens[row])])
            out.append(search.best())
        batch.timings["encoder"] = t1 - t0
        batch.timings["decode"] = time.perf_counter() - t1
        return out

    def stream_search(self, options) -> FramewiseSearch:
        return FramewiseSearch(self.ctx.model)


class FramewiseSearch:
    keeps_hidden = False

    def __init__(self, model):
        self.model = model
        self.tokens: list[int] = []
        self.frames: list[int] = []
        self.prev = 0
        self.seen = 0

    def advance(self, hidden: torch.Tensor) -> None:
        self.add(self.model.classifier(hidden).argmax(-1).cpu())

    def add(self, classes: torch.Tensor) -> None:
        for t, c in enumerate(classes.tolist()):
            if c != 0 and c != self.prev:
                self.tokens.append(c)
                self.frames.append(self.seen + t)
            self.prev = c
        self.seen += classes.numel()

    def best(self) -> Hypothesis:
        return Hypothesis(tokens=list(self.tokens), token_frames=list(self.frames))

    def final(self, hidden, frame_seconds) -> Hypothesis:
        hyp = self.best()
        hyp.token_times = [round(f * frame_seconds, 3) for f in self.frames]
        return hyp
