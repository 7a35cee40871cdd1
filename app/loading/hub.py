"""Models named as Hugging Face repositories (`org/name`), found in the local hub cache.

A model value of the form `org/name` that is not an existing directory is a repository id, as
llama-server's `-hf` and mlx-lm read it. It resolves to its cached snapshot (the revision
`refs/main` names) with no network: huggingface_hub is asked for local files only, unless the
operator allows a download (`server.allow_model_download`, flag `--hf-download`), and even then
`HF_HUB_OFFLINE=1` keeps it offline, as huggingface_hub does. The snapshot must be a folder of
the repository's own `snapshots/`: a `refs/main` holding `../` (huggingface_hub joins it to the
path as it is) would otherwise serve a model from anywhere on disk.
"""

from __future__ import annotations

import re
from pathlib import Path

from app.loading.checkpoint import ModelLoadError

REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


def is_repo_id(value: str, anchor: Path | None = None) -> bool:
    """`org/name`, naming no directory (relative to `anchor` when given, else the working directory)."""
    if REPO_ID.fullmatch(value) is None or value.endswith((".", "..")):
        return False
    return not ((anchor / value) if anchor is not None else Path(value)).expanduser().exists()


def cached_model(repo_id: str, *, allow_download: bool) -> Path:
    """The snapshot directory of `repo_id` in the hub cache; ModelLoadError when it is not there."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled

    folder = Path(constants.HF_HUB_CACHE) / f"models--{repo_id.replace('/', '--')}"
    try:
        snapshot = Path(snapshot_download(repo_id, local_files_only=not allow_download))
    except (LocalEntryNotFoundError, OfflineModeIsEnabled) as exc:
        how = (
            "the download failed or HF_HUB_OFFLINE is set"
            if allow_download
            else "nothing is downloaded unless server.allow_model_download (--hf-download) allows it"
        )
        raise ModelLoadError(
            f"{repo_id} is not in the Hugging Face cache (looked for {folder}; HF_HUB_CACHE or HF_HOME move it); "
            f"{how}: fetch it with `hf download {repo_id}` ({type(exc).__name__})"
        ) from exc
    except (HfHubHTTPError, OSError, ValueError) as exc:
        raise ModelLoadError(f"{repo_id}: cannot be fetched from the Hugging Face Hub: {exc}") from exc
    snapshots = (folder / "snapshots").resolve()
    if snapshot.resolve().parent != snapshots:
        raise ModelLoadError(
            f"{repo_id}: the cache's revision names {snapshot}, which is not a folder of {snapshots} "
            f"(refs/main holds a path, not a commit): fetch it again with `hf download {repo_id}`"
        )
    return snapshot
