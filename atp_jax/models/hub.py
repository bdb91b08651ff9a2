"""Models by Hugging Face Hub id (``org/name``): the safetensors, config and tokenizer files, downloaded once.

``huggingface_hub.snapshot_download`` fetches into its own cache (``HF_HOME``, default
``~/.cache/huggingface``) and a second call finds the files there without the network. Pickled weights
(``*.bin``) are never fetched. Where no hub can be reached — ``HF_HUB_OFFLINE=1``, or the endpoint does not
answer within a few seconds — a model that is not cached fails at once with a ``HubError`` naming the id,
never after minutes of retries. Gated models (Llama) read the token from ``HF_TOKEN``.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path
from urllib.parse import urlparse

# What a decoder needs: weights, configs and tokenizer files.
FILES = (
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
)
PROBE_TIMEOUT_S = 5.0
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")


class HubError(ValueError):
    """A hub id that cannot be fetched (offline, unknown, gated); the message names the id and the fix."""


def is_hub_id(spec: str) -> bool:
    """Whether ``spec`` reads as ``org/name`` and is not a local path."""
    return bool(_HUB_ID.fullmatch(spec)) and not Path(spec).expanduser().exists()


def fetch(repo_id: str, revision: str | None = None) -> Path:
    """The local folder holding ``repo_id``'s files (``FILES``), downloading what is not cached yet."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:  # cached: no network at all
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=list(FILES), local_files_only=True))
    except LocalEntryNotFoundError:
        pass
    if constants.HF_HUB_OFFLINE:
        raise HubError(
            f"model {repo_id!r} is not in the Hugging Face cache and HF_HUB_OFFLINE is set: download it on a machine "
            "with network access (it lands in $HF_HOME), or pass a local HF directory or .gguf file"
        )
    endpoint = constants.ENDPOINT
    if not _reachable(endpoint):
        raise HubError(
            f"model {repo_id!r}: the hub at {endpoint} cannot be reached (no answer within {PROBE_TIMEOUT_S:g} s) "
            "and the model is not in the Hugging Face cache; connect, set HF_ENDPOINT to a mirror, or pass a local "
            "HF directory or .gguf file"
        )
    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=list(FILES)))
    except GatedRepoError as e:
        raise HubError(f"model {repo_id!r} is gated: accept its licence on the hub and set HF_TOKEN ({e})") from None
    except RepositoryNotFoundError:
        raise HubError(f"model {repo_id!r} does not exist on {endpoint} (or is private: set HF_TOKEN)") from None
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as e:
        raise HubError(f"model {repo_id!r}: download from {endpoint} failed ({type(e).__name__}: {e})") from None


def revision_of(folder: Path) -> str | None:
    """The commit a snapshot folder holds (its name in the hub cache), or None outside the cache."""
    return folder.name if folder.parent.name == "snapshots" else None


def _reachable(endpoint: str) -> bool:
    url = urlparse(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname, port), timeout=PROBE_TIMEOUT_S):
            return True
    except OSError:
        return False
