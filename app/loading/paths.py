"""Where the repository and its embedded models are (no MLX here: the configuration layer uses it)."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
EMBEDDED_TARGET = REPO_ROOT / "models" / "target"
EMBEDDED_DRAFTER = REPO_ROOT / "models" / "drafter"
