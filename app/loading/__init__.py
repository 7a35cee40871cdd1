"""Model directories: what they are, and loading them.

Reading a checkpoint's config.json and the repository's paths need no MLX, so they import
eagerly; the loader (`app.loading.model`, MLX and mlx-lm: over a second) imports on first use,
which keeps the configuration layer (`app.profiles`, `mlxcel profiles`) free of model code.
"""

from typing import Any

from app.loading.checkpoint import (
    Checkpoint,
    CheckpointKind,
    ModelLoadError,
    drafter_kind_of,
    read_checkpoint,
)
from app.loading.paths import EMBEDDED_DRAFTER, EMBEDDED_TARGET

MODEL_NAMES = ("LoadedModel", "load_model")


def __getattr__(name: str) -> Any:
    if name in MODEL_NAMES:
        from app.loading import model

        return getattr(model, name)
    raise AttributeError(f"module 'app.loading' has no attribute {name!r}")


__all__ = [
    "EMBEDDED_DRAFTER",
    "EMBEDDED_TARGET",
    "Checkpoint",
    "CheckpointKind",
    "LoadedModel",
    "ModelLoadError",
    "drafter_kind_of",
    "load_model",
    "read_checkpoint",
]
