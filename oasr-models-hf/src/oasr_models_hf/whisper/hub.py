"""openai-whisper's model names as aliases of Hugging Face Hub checkpoints.

``tiny``, ``base``, ``small``, ``medium`` (and their ``.en`` variants), ``large-v1`` to ``large-v3``,
``large`` and ``turbo`` resolve to OpenAI's checkpoints on the hub through ``huggingface_hub``'s
cache: the first use downloads (``oasr download NAME`` does it ahead of time), later uses read the
cache, offline too.  ``tiny.en`` is the embedded default (``assets.resolve_tiny_en``).  faster-whisper's
``Systran/faster-whisper-*`` ids are hub ids already and load as they are.
"""

from __future__ import annotations

from collections.abc import Callable

from oasr.errors import CheckpointFormatError
from oasr_models_hf.plugin import HUB_IDS, resolver_name  # the table lives where the aliases register


def _resolver(alias: str, hub_id: str) -> Callable[[], str]:
    def resolve() -> str:
        from huggingface_hub import snapshot_download

        try:
            return snapshot_download(repo_id=hub_id, allow_patterns=["*.json", "*.safetensors", "*.txt"])
        except Exception as exc:  # offline without a cached copy, or the hub unavailable
            raise CheckpointFormatError(
                f"Whisper {alias!r} ({hub_id}) is not in the hub cache and could not be fetched ({exc}); "
                f"run 'oasr download {alias}' where the hub is reachable", path=hub_id) from exc

    resolve.__name__ = resolver_name(alias)
    resolve.__doc__ = f"A local directory holding {hub_id}."
    return resolve


for _alias, _hub_id in HUB_IDS.items():
    globals()[resolver_name(_alias)] = _resolver(_alias, _hub_id)
