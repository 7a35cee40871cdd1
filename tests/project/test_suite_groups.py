"""The suite's xdist groups hold: the tests of one group run in one worker process.

tests/conftest.py puts each shared server's tests in one `xdist_group`, so each server starts on one
worker, and expensive module references (tests/decoding/test_seeded_identity.py) are computed once.
pytest 9.2 silently undid that: pytest-xdist 3.8 marks a group by rewriting `item._nodeid`, which
9.2's structured node ids no longer read, so every test became a group of its own and the shared
servers started on both workers (issue 44). This runs a small session the way `make test` runs the
suite and fails if a group is split.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.support import ROOT

GROUPED = """
import os
import pytest

pytestmark = pytest.mark.xdist_group("one")


@pytest.mark.parametrize("i", range(6))
def test_grouped(i):
    with open(os.path.join(os.environ["GROUPS_OUT"], f"grouped-{i}"), "w") as out:
        out.write(str(os.getpid()))
"""
LOOSE = """
import time
import pytest


@pytest.mark.parametrize("i", range(6))
def test_loose(i):
    time.sleep(0.05)
"""


def test_a_group_runs_on_one_worker_under_the_suites_options(tmp_path: Path) -> None:
    addopts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    options = shlex.split(addopts)
    assert "loadgroup" in options, "the suite no longer distributes by group"
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    (tmp_path / "test_loose.py").write_text(LOOSE)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # none of the suite's own conftest or settings
    flags = ["-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "base")]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *flags, "-q", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ | {"GROUPS_OUT": str(tmp_path)},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    pids = {path.read_text() for path in tmp_path.glob("grouped-*")}
    assert len(list(tmp_path.glob("grouped-*"))) == 6
    assert len(pids) == 1, f"the group ran in {len(pids)} processes"
