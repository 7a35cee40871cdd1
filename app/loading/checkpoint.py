"""Reading a model directory's config.json and telling what kind of checkpoint it is."""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any


class ModelLoadError(Exception):
    """A path that cannot be used as asked. Command-line tools exit with code 2 on it."""


class CheckpointKind(StrEnum):
    STANDALONE = "standalone"
    DFLASH = "dflash"
    DSPARK = "dspark"
    MUSE = "muse"
    MTP = "mtp"


# Drafters that borrow the target's embedding and lm_head: they cannot run on their own.
DFLASH_ARCHITECTURES = {"DFlashDraftModel", "DFlash2DraftModel"}
DSPARK_ARCHITECTURES = {"Lfm2DSparkDraftModel"}
MUSE_ARCHITECTURES = {"MuseGlimmerAssistantModel"}
MTP_ARCHITECTURES = {"MtpDraftHead"}


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    config: dict[str, Any]
    kind: CheckpointKind

    @property
    def is_standalone(self) -> bool:
        return self.kind is CheckpointKind.STANDALONE


def drafter_kind_of(config: dict[str, Any]) -> CheckpointKind:
    """The structural test: architecture names and config blocks, never `model_type` alone.

    DFlash drafters declare their backbone's `model_type` ("qwen3"), so keying on it would make
    every ordinary small Qwen3 model look like one.
    """
    architectures = set(config.get("architectures") or [])
    if config.get("model_type") == "muse_glimmer_assistant" or architectures & MUSE_ARCHITECTURES:
        return CheckpointKind.MUSE
    if architectures & MTP_ARCHITECTURES or isinstance(config.get("mtp_config"), dict):
        return CheckpointKind.MTP
    is_dflash_shaped = isinstance(config.get("dflash_config"), dict) or bool(
        architectures & (DFLASH_ARCHITECTURES | DSPARK_ARCHITECTURES)
    )
    if not is_dflash_shaped:
        return CheckpointKind.STANDALONE
    if int(config.get("markov_rank") or 0) > 0 or architectures & DSPARK_ARCHITECTURES:
        return CheckpointKind.DSPARK
    return CheckpointKind.DFLASH


def read_checkpoint(path: str | Path) -> Checkpoint:
    """Read `path/config.json`; refuse paths that are not model directories."""
    path = Path(path).expanduser()
    if not path.exists():
        raise ModelLoadError(f"model path does not exist: {path}")
    if not path.is_dir():
        raise ModelLoadError(f"not a model directory (a file was given): {path}")
    config_file = path / "config.json"
    if not config_file.exists() or config_file.is_dir():  # a named pipe or other readable file will do
        raise ModelLoadError(f"not a model directory (no config.json): {path}")
    try:
        config = json.loads(config_file.read_text())
    except OSError as exc:
        raise ModelLoadError(f"cannot read {config_file}: {exc.strerror}") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"not a model directory (config.json is not valid JSON: {exc}): {path}") from exc
    if not isinstance(config, dict) or "model_type" not in config:
        raise ModelLoadError(f"not a model directory (config.json has no model_type): {path}")
    if not any(path.glob("*.safetensors")):
        raise ModelLoadError(f"not a model directory (no *.safetensors weights): {path}")
    return Checkpoint(path=path, config=config, kind=drafter_kind_of(config))


def require_standalone(checkpoint: Checkpoint, role: str) -> None:
    """Refuse a drafter-only checkpoint where a standalone model is needed."""
    if checkpoint.is_standalone:
        return
    raise ModelLoadError(
        f"{checkpoint.path} is a {checkpoint.kind} drafter checkpoint, not a standalone model: it ships "
        f"no embed_tokens or lm_head and borrows the target's, so it cannot serve as the {role}. "
        f"Run it as a drafter with `mlxcel serve` (drafter.kind = "
        f'"{"mtp" if checkpoint.kind is CheckpointKind.MTP else "dflash"}").'
    )
