"""Package layering: the import-linter contracts in pyproject.toml, and a configuration layer without MLX."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support import ROOT


def test_the_import_contracts_hold() -> None:
    """Layers (cli > server > engine > decoding > profiles > drafters > acceptance > sampling >
    execution > loading > runtime > events) and no cycle between sibling packages or modules."""
    lint_imports = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint_imports), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_importing_the_profiles_leaves_mlx_out() -> None:
    """`mlxcel profiles list` and the settings layer pay for no model code."""
    code = "import app.profiles, sys; print(sorted(m for m in sys.modules if m.split('.')[0] in ('mlx', 'mlx_lm')))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_mlxcel_profiles_leaves_mlx_out() -> None:
    """The CLI imports a subcommand's module only when it runs: `mlxcel profiles` loads no MLX
    (generate and serve do, for seconds)."""
    code = (
        "import sys; from app.cli import main; main(['profiles', 'list']); main(['profiles', 'check']); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mlx', 'mlx_lm')))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"


def test_a_bad_profile_fails_serve_before_mlx_loads() -> None:
    """`mlxcel serve` checks the profile and the port before importing the engine (app/cli/serving.py)."""
    code = (
        "import sys; from app.cli import main; print(main(['serve', '--port', '-1'])); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mlx', 'mlx_lm')))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.stdout.splitlines() == ["2", "[]"], (done.stdout, done.stderr)
    assert "port" in done.stderr
