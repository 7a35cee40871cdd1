"""`make run` as the README says: PORT, HOST and PROFILE chosen on make's command line, and a
SIGTERM to make's process group (as a shell, a process manager or a container runtime sends it)
drains the server instead of forcing it down; a fresh machine's install says what it is doing,
with a time estimate, and lets pip show what it fetches."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.support import ROOT
from tests.support.server import clean_env, free_port, wait_healthy

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


@pytest.mark.slow
def test_make_run_serves_on_the_port_it_is_given_and_sigterm_to_its_group_drains(tmp_path: Path) -> None:
    port = free_port()
    out = tmp_path / "make-run.log"
    with out.open("w") as log:
        make = subprocess.Popen(
            ["make", "--no-print-directory", "run", f"PORT={port}", "HOST=127.0.0.1", "PROFILE=target-only"],
            cwd=ROOT, env=clean_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            url = f"http://127.0.0.1:{port}"
            wait_healthy(url, make)
            assert httpx.get(f"{url}/props", timeout=10).json()["mlxcel"]["profile"] == "target-only"
            body = {"prompt": "def main():\n", "n_predict": 48, "ignore_eos": True, "temperature": 0, "stream": True}
            with httpx.stream("POST", f"{url}/completion", json=body, timeout=60) as response:
                lines = response.iter_lines()
                next(line for line in lines if line.startswith("data: "))
                os.killpg(make.pid, signal.SIGTERM)  # make and the server it runs, both
                last = [json.loads(line[6:]) for line in lines if line.startswith("data: ")][-1]
            assert last["stop"] is True and last["tokens_predicted"] == 48  # the running row finished
            make.wait(60)
        finally:
            if make.poll() is None:
                os.killpg(make.pid, signal.SIGKILL)
    events = [json.loads(line)["event"] for line in out.read_text().splitlines() if line.startswith("{")]
    assert "draining" in events and "forced_exit" not in events
    assert "make: starting mlxcel serve" in out.read_text()


# A stand-in interpreter: `-m venv DIR` makes DIR/bin/python (itself); any other call prints its arguments.
FAKE_PYTHON = """#!/bin/sh
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && exit 0; fi
echo "python $*"
"""


def test_a_fresh_install_says_each_step_with_a_time_estimate(tmp_path: Path) -> None:
    """The Makefile's own install recipe on a fresh VENV, its interpreter a stand-in (nothing is
    downloaded): every step is announced, the whole with an estimate, and pip is not silenced."""
    fake = tmp_path / "python3"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    venv = tmp_path / "venv"
    result = subprocess.run(
        ["make", "--no-print-directory", "install", f"VENV={venv}", f"PYTHON={fake}"],
        cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"make: setting up {venv} for mlxcel: 1 to 7 minutes")
    steps = [line for line in lines if line.startswith("make: [")]
    assert [step[:11] for step in steps] == ["make: [1/3]", "make: [2/3]", "make: [3/3]"]
    (pip,) = [line for line in lines if " pip install " in line]
    assert "--quiet" not in pip and "-q" not in pip.split()
    assert any(line.startswith("make: dependencies installed in ") for line in lines)
    assert (venv / ".installed").exists()
