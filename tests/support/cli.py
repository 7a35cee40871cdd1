"""Running `mlxcel` as a process, and writing profiles for it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from app.loading import EMBEDDED_DRAFTER, EMBEDDED_TARGET
from tests.support.server import clean_env


def mlxcel(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", *args], capture_output=True, text=True, env=clean_env(**(env or {}))
    )


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(text.replace("@TARGET@", str(EMBEDDED_TARGET)).replace("@DRAFTER@", str(EMBEDDED_DRAFTER)))
    return path
