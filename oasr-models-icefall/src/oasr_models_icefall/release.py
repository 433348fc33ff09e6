"""Reading an icefall release directory (shared by every icefall converter).

An icefall release, as ``export.py`` and the published model repositories lay it out::

    exp/pretrained.pt            {"model": state_dict}   (export.py without --jit)
    exp/epoch-N.pt               a training checkpoint (accepted when it holds plain tensors)
    exp/jit_script.pt            TorchScript (export.py --jit): refused, it is code, not weights
    data/lang_bpe_<N>/bpe.model  the SentencePiece model
    data/lang_bpe_<N>/tokens.txt "piece id" lines (<blk> 0, <sos/eos> 1, <unk> 2, #0, #1 ...)

The functions, kept small and stable because several converters call them:

- :func:`is_release_dir` — the directory has an ``exp/*.pt`` and a ``data/lang_bpe_*`` folder.
- :func:`checkpoint_file` — which file of ``exp/`` holds the weights (or a clear refusal).
- :func:`load_state_dict` — that file's ``model`` state dict, read with ``weights_only=True``.
- :func:`checkpoint_keys` — the state-dict keys alone, read lazily (for ``detect``); empty when unreadable.
- :func:`lang_dir` — the ``data/lang_bpe_*`` folder.
- :func:`token_ids` — ``tokens.txt`` as piece → id.
- :func:`tokenizer_spec` — a ``sentencepiece`` :class:`TokenizerSpec` with blank/sos-eos/unk special.
- :func:`feature_spec` — icefall's (lhotse's) fbank defaults as a :class:`FeatureSpec`.
- :data:`LOG_EPS` — ``log(1e-10)``, the value icefall pads feature matrices (and short streaming
  windows) with.
"""

from __future__ import annotations

import math
import re
import zipfile
from pathlib import Path

import torch

from oasr.checkpoints import load_torch_checkpoint
from oasr.errors import CheckpointFormatError
from oasr.models import FeatureSpec, TokenizerSpec

#: icefall's feature padding value (``LOG_EPS = math.log(1e-10)`` in its decode scripts)
LOG_EPS = math.log(1e-10)
EXP_DIR = "exp"
PRETRAINED = "pretrained.pt"
_EPOCH = re.compile(r"epoch-(\d+)\.pt")
#: icefall's special pieces: the blank, the shared sos/eos and the unknown piece
SPECIAL_PIECES = ("<blk>", "<sos/eos>", "<unk>")
EXPORT_HINT = ("export the weights with icefall's export.py (without --jit), which writes exp/pretrained.pt "
               "= {'model': state_dict}")


def is_release_dir(path: Path) -> bool:
    """True when ``path`` looks like an icefall release: ``exp/*.pt`` plus ``data/lang_bpe_*/``."""
    path = Path(path)
    exp = path / EXP_DIR
    has_weights = exp.is_dir() and any(exp.glob("*.pt"))
    return has_weights and any(p.is_dir() for p in (path / "data").glob("lang_bpe_*"))


def _is_torchscript(file: Path) -> bool:
    """A TorchScript archive (``torch.jit.save``) carries ``code/`` and ``constants.pkl`` entries."""
    if not zipfile.is_zipfile(file):
        return False
    with zipfile.ZipFile(file) as archive:
        names = archive.namelist()
    return any(n.endswith("/constants.pkl") or "/code/" in n for n in names)


def checkpoint_file(path: Path, name: str | None = None) -> Path:
    """The weights file of a release: ``name`` (inside the directory) if given, else
    ``exp/pretrained.pt``, else the highest ``exp/epoch-N.pt``.  A directory with only TorchScript
    (``jit_script.pt``) or nothing usable is refused, naming what to export instead."""
    path = Path(path)
    if name is not None:
        file = (path / name).resolve()
        if not file.is_relative_to(path.resolve()):
            raise CheckpointFormatError(f"checkpoint {name!r} is outside {path}", path=path)
        if not file.is_file():
            raise CheckpointFormatError(f"checkpoint {file} does not exist", path=file)
        return file
    exp = path / EXP_DIR
    if (exp / PRETRAINED).is_file():
        return exp / PRETRAINED
    epochs = sorted((int(m.group(1)), p) for p in exp.glob("epoch-*.pt") if (m := _EPOCH.fullmatch(p.name)))
    if epochs:
        return epochs[-1][1]
    found = sorted(p.name for p in exp.glob("*.pt")) if exp.is_dir() else []
    raise CheckpointFormatError(
        f"{exp}: no pretrained.pt or epoch-N.pt (found: {', '.join(found) or 'nothing'}); {EXPORT_HINT}", path=exp)


def load_state_dict(path: Path, name: str | None = None) -> dict[str, torch.Tensor]:
    """The ``model`` state dict of a release's weights file (see :func:`checkpoint_file`).

    Only plain tensors and containers are read (``weights_only=True``).  TorchScript and training
    checkpoints that pickle objects (icefall's ``AttributeDict`` of params) are refused with a
    :class:`CheckpointFormatError` naming the file and the export that produces a loadable one.
    """
    file = checkpoint_file(path, name)
    if _is_torchscript(file):
        raise CheckpointFormatError(
            f"{file} is a TorchScript module (code and weights together), which OASR does not load; {EXPORT_HINT}",
            path=file)
    try:
        obj = load_torch_checkpoint(file)
    except CheckpointFormatError as exc:
        raise CheckpointFormatError(f"{exc}; for an icefall checkpoint, {EXPORT_HINT}", path=file) from exc
    model = obj.get("model") if isinstance(obj, dict) else None
    if not isinstance(model, dict) or not model or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in model.items()):
        keys = ", ".join(sorted(map(str, obj))[:8]) if isinstance(obj, dict) else type(obj).__name__
        raise CheckpointFormatError(
            f"{file} has no 'model' state dict of tensors (found: {keys}); {EXPORT_HINT}", path=file)
    return dict(model)


def checkpoint_keys(path: Path, name: str | None = None) -> frozenset[str]:
    """The ``model`` state-dict keys of a release's weights file, memory-mapped (no tensor data is
    read); empty when the file is missing or not plain tensors (:func:`load_state_dict` explains)."""
    try:
        file = checkpoint_file(path, name)
        if _is_torchscript(file):
            return frozenset()
        obj = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # unreadable here; the loader names the problem
        return frozenset()
    model = obj.get("model") if isinstance(obj, dict) else None
    return frozenset(k for k in model if isinstance(k, str)) if isinstance(model, dict) else frozenset()


def lang_dir(path: Path) -> Path:
    """The release's ``data/lang_bpe_*`` folder (the one with a ``bpe.model``)."""
    path = Path(path)
    candidates = sorted(p for p in (path / "data").glob("lang_bpe_*") if (p / "bpe.model").is_file())
    if not candidates:
        raise CheckpointFormatError(f"{path}: no data/lang_bpe_*/bpe.model (the release's SentencePiece model)",
                                    path=path)
    if len(candidates) > 1:
        names = ", ".join(p.name for p in candidates)
        raise CheckpointFormatError(f"{path}/data has several BPE folders ({names}); keep the one the model was "
                                    f"trained with", path=path)
    return candidates[0]


def token_ids(path: Path) -> dict[str, int]:
    """``tokens.txt`` of the release as piece → id."""
    file = lang_dir(path) / "tokens.txt"
    if not file.is_file():
        raise CheckpointFormatError(f"{file} does not exist; an icefall lang dir has bpe.model and tokens.txt",
                                    path=file)
    table: dict[str, int] = {}
    for lineno, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 2 or not fields[1].isdigit():
            raise CheckpointFormatError(f"{file}:{lineno}: expected 'piece id', got {line!r}", path=file)
        table[fields[0]] = int(fields[1])
    return table


def tokenizer_spec(path: Path, vocab_size: int | None = None) -> TokenizerSpec:
    """The release's SentencePiece model, with icefall's special pieces (blank, sos/eos, unk) marked.

    ``vocab_size`` (the model's output width) is checked against ``bpe.model`` when given.
    """
    import sentencepiece

    model = lang_dir(path) / "bpe.model"
    sp = sentencepiece.SentencePieceProcessor(model_file=str(model))
    if vocab_size is not None and sp.get_piece_size() != vocab_size:
        raise CheckpointFormatError(f"{model} has {sp.get_piece_size()} pieces but the model outputs {vocab_size}",
                                    path=model)
    tokens = token_ids(path)
    specials = tuple(sorted({tokens[p] for p in SPECIAL_PIECES if p in tokens}))
    return TokenizerSpec(kind="sentencepiece", files={"model": str(model.resolve())}, special_ids=specials)


def special_id(path: Path, piece: str, default: int) -> int:
    """The id of a special piece (``<blk>``, ``<unk>``) from tokens.txt, ``default`` when absent."""
    return token_ids(path).get(piece, default)


def feature_spec(num_mel_bins: int = 80, sample_rate: int = 16000) -> FeatureSpec:
    """icefall's features: lhotse's ``Fbank`` defaults (samples in [-1, 1], ``snip_edges=False``,
    ``high_freq=-400`` i.e. Nyquist − 400 Hz, povey window, no dither at inference)."""
    return FeatureSpec(
        kind="kaldi_fbank", sample_rate=sample_rate, num_mel_bins=num_mel_bins, frame_length_ms=25.0,
        frame_shift_ms=10.0, dither=0.0, window_type="povey", snip_edges=False, low_freq=20.0, high_freq=-400.0,
        audio_scale=1.0)
