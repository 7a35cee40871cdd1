"""Model directories on disk: what they are (config.json, kinds), the repository's paths, whether a
drafter pairs with a target, chat templates, a token's bytes.

`import app.loading` loads no MLX, so the configuration layer (`app.profiles`, `mlxcel profiles`) stays
free of model code; loading weights onto a device is `app.execution.model`.
"""

from app.loading.checkpoint import (
    Checkpoint,
    CheckpointKind,
    ModelLoadError,
    drafter_kind_of,
    read_checkpoint,
)
from app.loading.paths import EMBEDDED_DRAFTER, EMBEDDED_TARGET

__all__ = [
    "EMBEDDED_DRAFTER",
    "EMBEDDED_TARGET",
    "Checkpoint",
    "CheckpointKind",
    "ModelLoadError",
    "drafter_kind_of",
    "read_checkpoint",
]
