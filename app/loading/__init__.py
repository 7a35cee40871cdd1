"""Model directories: what they are, and loading them."""

from app.loading.checkpoint import (
    Checkpoint,
    CheckpointKind,
    ModelLoadError,
    drafter_kind_of,
    read_checkpoint,
)
from app.loading.model import (
    EMBEDDED_DRAFTER,
    EMBEDDED_TARGET,
    LoadedModel,
    check_vocab_agreement,
    load_model,
)

__all__ = [
    "EMBEDDED_DRAFTER",
    "EMBEDDED_TARGET",
    "Checkpoint",
    "CheckpointKind",
    "LoadedModel",
    "ModelLoadError",
    "check_vocab_agreement",
    "drafter_kind_of",
    "load_model",
    "read_checkpoint",
]
