"""``BatchedStreamingFeatureExtractor``: features of B parallel audio streams fed in chunks.

Each slot holds a sample buffer that starts with the framing's ``prefill`` zeros.  A chunk is scaled by
``audio_scale`` and appended; every frame that now fits (``StreamingFraming.frames_in``) is computed —
for all slots of the call in one batched extractor call — and returned, and the consumed samples are
dropped (the buffer keeps ``history`` samples of context before the next frame).  ``flush`` appends the
framing's ``postfill`` zeros (as zeros after any per-sample transform: the extractor sees them as past
the valid length), returns the last frames and resets the slot for its next stream.  A ``mirror``
framing (Kaldi ``snip_edges=False``) writes the stream's mirrored first samples into the buffer once
they have arrived and mirrors its end at the flush, which emits the rest of Kaldi's frame count.

Everything comes from the extractor's declared :class:`~oasr.features.StreamingFraming`, so for every
chunking of a signal the frames equal the offline features of the whole signal exactly (the built-in
extractors compute a frame identically wherever it falls in a batch).  A frontend without framing
(``whisper_logmel``), LFR and per-utterance normalization are refused at construction.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from oasr.errors import CapabilityError
from oasr.features.config import FeatureConfig
from oasr.features.normalize import normalize_features
from oasr.features.pipeline import extractor_for


class BatchedStreamingFeatureExtractor:
    """Chunked feature extraction for ``batch_size`` stream slots (see the module docstring)."""

    def __init__(self, config: FeatureConfig, batch_size: int, *, device: torch.device | str = "cpu"):
        extractor = extractor_for(config)
        if extractor.framing is None:
            raise CapabilityError(
                f"feature_type {config.feature_type!r} cannot stream with this config: the frontend declares no "
                f"StreamingFraming for it (fixed window, reflected edges or whole-utterance statistics)",
                capability="streaming")
        if config.lfr_m != 1 or config.lfr_n != 1:
            raise CapabilityError(f"LFR stacking (lfr_m={config.lfr_m}, lfr_n={config.lfr_n}) is offline only",
                                  capability="streaming")
        if config.normalize == "per_feature":
            raise CapabilityError("normalize='per_feature' needs the whole utterance and cannot stream",
                                  capability="streaming")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.config = config
        self.batch_size = batch_size
        self.device = torch.device(device)
        self.framing = extractor.framing
        self._extractor = extractor
        self._fn = extractor.streaming_fn or extractor.fn
        self._offline_fn = extractor.fn
        self.feature_dim = extractor.feature_dim
        self._buffers: list[torch.Tensor] = [self._fresh_buffer() for _ in range(batch_size)]
        self._frames_emitted = [0] * batch_size
        self._samples_seen = [0] * batch_size
        #: mirror framing: the slot's buffer starts with its mirrored first samples
        self._mirrored = [False] * batch_size

    # --- slots ---------------------------------------------------------------------------------
    def _fresh_buffer(self) -> torch.Tensor:
        return torch.zeros(self.framing.prefill, device=self.device)

    def reset(self, slots: int | Sequence[int] | None = None) -> None:
        """Forget the given slots' streams (all slots when None), ready for new streams."""
        for slot in self._slots(range(self.batch_size) if slots is None else slots):
            self._buffers[slot] = self._fresh_buffer()
            self._frames_emitted[slot] = 0
            self._samples_seen[slot] = 0
            self._mirrored[slot] = False

    def frames_emitted(self, slot: int) -> int:
        return self._frames_emitted[slot]

    def samples_seen(self, slot: int) -> int:
        return self._samples_seen[slot]

    def _slots(self, slots: int | Sequence[int]) -> list[int]:
        listed = [slots] if isinstance(slots, (int, np.integer)) else list(slots)
        for slot in listed:
            if not 0 <= int(slot) < self.batch_size:
                raise IndexError(f"stream slot {slot} outside [0, {self.batch_size})")
        if len(set(listed)) != len(listed):
            raise ValueError(f"stream slots repeat in one call: {listed}")
        return [int(s) for s in listed]

    # --- feeding -------------------------------------------------------------------------------
    def process_chunk(self, slots: int | Sequence[int],
                      samples: torch.Tensor | np.ndarray | Sequence[torch.Tensor | np.ndarray]
                      ) -> torch.Tensor | list[torch.Tensor]:
        """Append a chunk of [-1, 1] samples to each slot; return the new frames, (n_i, F) per slot.

        ``slots`` an int with ``samples`` a 1-D chunk returns one tensor; a sequence of slots with a
        sequence of chunks returns a list.
        """
        single = isinstance(slots, (int, np.integer))
        slot_list = self._slots(slots)
        chunks = [samples] if single else list(samples)
        if len(chunks) != len(slot_list):
            raise ValueError(f"{len(chunks)} chunks for {len(slot_list)} slots")
        for slot, chunk in zip(slot_list, chunks, strict=True):
            chunk = torch.as_tensor(chunk, dtype=torch.float32).reshape(-1).to(self.device)
            if self.config.audio_scale != 1.0:
                chunk = chunk * self.config.audio_scale
            self._buffers[slot] = torch.cat([self._buffers[slot], chunk])
            self._samples_seen[slot] += chunk.numel()
            mirror = self.framing.mirror
            if mirror and not self._mirrored[slot] and self._buffers[slot].numel() >= mirror:
                self._buffers[slot] = torch.cat([self._buffers[slot][:mirror].flip(0), self._buffers[slot]])
                self._mirrored[slot] = True
        frames = self._emit(slot_list, postfill=False)
        return frames[0] if single else frames

    def flush(self, slots: int | Sequence[int]) -> torch.Tensor | list[torch.Tensor]:
        """End the given slots' streams: return their remaining frames and reset the slots."""
        single = isinstance(slots, (int, np.integer))
        slot_list = self._slots(slots)
        frames = self._flush_mirrored(slot_list) if self.framing.mirror else self._emit(slot_list, postfill=True)
        self.reset(slot_list)
        return frames[0] if single else frames

    def _flush_mirrored(self, slots: list[int]) -> list[torch.Tensor]:
        """The last frames of ``mirror`` streams: the buffer's end mirrored up to the last frame of
        Kaldi's count (a stream shorter than the mirror is framed whole by the offline function)."""
        framing = self.framing
        results = [torch.zeros(0, self.feature_dim, device=self.device) for _ in slots]
        needs = []
        for i, slot in enumerate(slots):
            total = framing.total_frames(self._samples_seen[slot])
            need = total - self._frames_emitted[slot]
            needs.append(need)
            buffer = self._buffers[slot]
            if need <= 0:
                continue
            if not self._mirrored[slot]:
                feats, counts = self._offline_fn(buffer[None], torch.tensor([buffer.numel()]), self.config)
                results[i] = normalize_features(feats, counts, self.config)[0, :need]
                needs[i] = 0
                continue
            # signal samples past the end that the last frame reads, mirrored from the buffer's end
            tail = (total - 1) * framing.hop - framing.mirror + framing.span - self._samples_seen[slot]
            if tail > buffer.numel():
                raise RuntimeError(f"mirror framing {framing} lost samples its last frame reads")
            if tail > 0:
                self._buffers[slot] = torch.cat([buffer, buffer[buffer.numel() - tail:].flip(0)])
        todo = [i for i, n in enumerate(needs) if n > 0]
        if todo:
            emitted = self._emit([slots[i] for i in todo], postfill=False, limits=[needs[i] for i in todo])
            for i, frames in zip(todo, emitted, strict=True):
                results[i] = frames
        return results

    def _emit(self, slots: list[int], *, postfill: bool, limits: list[int] | None = None) -> list[torch.Tensor]:
        framing = self.framing
        tail = framing.postfill if postfill else 0
        valid = [self._buffers[s].numel() for s in slots]
        ready = [framing.frames_in(n + tail) if self._mirrored[s] or not framing.mirror else 0
                 for s, n in zip(slots, valid, strict=True)]
        if limits is not None:
            ready = [min(n, limit) for n, limit in zip(ready, limits, strict=True)]
        results = [torch.zeros(0, self.feature_dim, device=self.device) for _ in slots]
        todo = [i for i, n in enumerate(ready) if n > 0]
        if todo:
            width = max(valid[i] + tail for i in todo)
            batch = torch.zeros(len(todo), width, device=self.device)
            for row, i in enumerate(todo):
                batch[row, :valid[i]] = self._buffers[slots[i]]
            lengths = torch.tensor([valid[i] for i in todo], dtype=torch.long)
            feats, _ = self._fn(batch, lengths, self.config)
            counts = torch.tensor([ready[i] for i in todo], dtype=torch.long)
            feats = normalize_features(feats, counts, self.config)
            for row, i in enumerate(todo):
                slot, n = slots[i], ready[i]
                results[i] = feats[row, :n]
                self._frames_emitted[slot] += n
                self._buffers[slot] = self._buffers[slot][n * framing.hop:].clone()
        return results
