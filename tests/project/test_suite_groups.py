"""The suite's xdist groups hold: the tests of one group run in one worker process.

tests/conftest.py puts each shared server's tests in one `xdist_group`, so each server starts on one
worker, and expensive module references (tests/decoding/test_seeded_identity.py) are computed once.
pytest 9.2 silently undid that: pytest-xdist 3.8 marks a group by rewriting `item._nodeid`, which
9.2's structured node ids no longer read, so every test became a group of its own and the shared
servers started on both workers (issue 44). And the groups tests/conftest.py gives (a module's
server, a shared profile's) were never read: xdist reads groups into node ids in its own
`pytest_collection_modifyitems`, which ran before the suite's until the suite's became `tryfirst`.
This runs a small session the way `make test` runs the suite, with a group of its own mark and
one of the suite's hook, and fails if either is split.
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
# grouped by tests/conftest.py's hook, as a module with a server of its own is
SERVED = """
import os
import pytest


@pytest.fixture(scope="module")
def server():
    return os.getpid()


@pytest.mark.parametrize("i", range(6))
def test_grouped(i, server):
    with open(os.path.join(os.environ["GROUPS_OUT"], f"served-{i}"), "w") as out:
        out.write(str(server))
"""
SUITE_HOOK = "from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n"
LOOSE = """
import time
import pytest


@pytest.mark.parametrize("i", range(6))
def test_loose(i):
    time.sleep(0.05)
"""


def test_groups_run_on_one_worker_under_the_suites_options(tmp_path: Path) -> None:
    addopts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    options = shlex.split(addopts)
    assert "loadgroup" in options, "the suite no longer distributes by group"
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    (tmp_path / "test_served.py").write_text(SERVED)
    (tmp_path / "conftest.py").write_text(SUITE_HOOK)
    (tmp_path / "test_loose.py").write_text(LOOSE)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # none of the suite's own conftest or settings
    # xdist alone of the installed plugins: autoloading them all (schemathesis, hypothesis, Faker,
    # langsmith) costs each of the three processes about 3.5 s of CPU, two thirds of this test
    flags = [
        "-p",
        "xdist",
        "-n",
        "2",
        "--dist",
        "loadgroup",
        "-p",
        "no:cacheprovider",
        "--basetemp",
        str(tmp_path / "base"),
    ]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *flags, "-q", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ | {"GROUPS_OUT": str(tmp_path), "PYTHONPATH": str(ROOT), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    for group in ("grouped", "served"):  # by its own mark; by the suite's hook
        pids = {path.read_text() for path in tmp_path.glob(f"{group}-*")}
        assert len(list(tmp_path.glob(f"{group}-*"))) == 6
        assert len(pids) == 1, f"the {group} group ran in {len(pids)} processes"
