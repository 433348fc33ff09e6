"""The entry points of NeMo's TDT beam searches: the search state for a ``search_type``
(:class:`~oasr.decoding.tdt_beam.TdtBeamRows` for ``"default"``, :class:`~oasr.decoding.tdt_maes.TdtMaesRows`
for ``"maes"``) and a whole-utterance search over projected encoder frames."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from oasr.decoding.tdt_beam import TdtBeamRows
from oasr.decoding.tdt_maes import TdtMaesRows
from oasr.decoding.transducer import _check_enc, _row_lengths
from oasr.decoding.types import Hypothesis
from oasr.errors import ConfigError

__all__ = ["tdt_beam_rows", "tdt_beam_search"]


def tdt_beam_rows(predictor: Any, joiner: Any, batch: int, device: torch.device | str, *, blank_id: int,
                  beam_size: int = 4, search: str = "default") -> TdtBeamRows:
    """The search state of NeMo's ``search_type`` ``"default"`` (:class:`TdtBeamRows`) or ``"maes"``
    (:class:`~oasr.decoding.tdt_maes.TdtMaesRows`, NeMo's default mAES settings)."""
    if search == "maes":
        return TdtMaesRows(predictor, joiner, batch, device, blank_id=blank_id, beam_size=beam_size)
    if search != "default":
        raise ConfigError(f"TDT beam search type must be 'default' or 'maes', got {search!r}", key="search")
    return TdtBeamRows(predictor, joiner, batch, device, blank_id=blank_id, beam_size=beam_size)


def tdt_beam_search(predictor: Any, joiner: Any, enc_proj: torch.Tensor, lengths: torch.Tensor | Sequence[int], *,
                    blank_id: int, beam_size: int = 4, n_best: int = 1, search: str = "default"
                    ) -> list[list[Hypothesis]]:
    """TDT beam search (``search``: ``"default"`` or ``"maes"``) of each row of the projected frames ``enc_proj``
    (B, T, J): the ``n_best`` best per row."""
    _check_enc(enc_proj)
    if int(n_best) < 1 or int(n_best) > int(beam_size):
        raise ConfigError(f"n_best must lie in [1, beam_size={beam_size}], got {n_best}", key="n_best")
    lens = _row_lengths(lengths, enc_proj.shape[0], enc_proj.shape[1])
    rows = tdt_beam_rows(predictor, joiner, enc_proj.shape[0], enc_proj.device, blank_id=blank_id,
                         beam_size=beam_size, search=search)
    for t in range(max(lens, default=0)):
        active = [b for b, n in enumerate(lens) if n > t]
        rows.step(enc_proj[torch.tensor(active, dtype=torch.long, device=enc_proj.device), t], active)
    return [rows.results(b, n_best) for b in range(enc_proj.shape[0])]
