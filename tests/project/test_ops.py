"""The deployment files in ops/deploy parse, and refer to things that exist."""

from __future__ import annotations

import json
import plistlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.profiles import shipped_profiles
from tests.support import ROOT
from tests.support.server import clean_env, free_port

DEPLOY = ROOT / "ops" / "deploy"


def test_systemd_unit_verifies(tmp_path: Path) -> None:
    unit = (DEPLOY / "mlxcel@.service").read_text().replace("/opt/mlxcel", str(ROOT))
    assert "ExecStart=/opt" not in unit and f"ExecStart={ROOT}/.venv/bin/mlxcel serve --profile %i" in unit
    instance = tmp_path / "mlxcel@default.service"
    instance.write_text(unit)
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed here")
    result = subprocess.run(["systemd-analyze", "verify", str(instance)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "Unknown" not in result.stderr


def test_systemd_verify_catches_a_broken_unit(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed here")
    broken = tmp_path / "broken@x.service"
    broken.write_text((DEPLOY / "mlxcel@.service").read_text().replace("ExecStart=", "ExecStrat="))
    assert subprocess.run(["systemd-analyze", "verify", str(broken)], capture_output=True).returncode != 0


def test_launchd_plist_runs_a_shipped_profile() -> None:
    plist = plistlib.loads((DEPLOY / "com.mlxcel.server.plist").read_bytes())
    arguments = plist["ProgramArguments"]
    assert arguments[1:3] == ["serve", "--profile"] and arguments[3] in shipped_profiles()
    assert plist["Label"].endswith(arguments[3]) and plist["KeepAlive"] == {"SuccessfulExit": False}


def test_dockerfile_instructions_and_targets() -> None:
    keywords = {"FROM", "RUN", "COPY", "WORKDIR", "USER", "ENV", "EXPOSE", "HEALTHCHECK", "ENTRYPOINT", "CMD"}
    lines = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ").splitlines()
    instructions = [line.split()[0] for line in lines if line.strip() and not line.startswith("#")]
    assert set(instructions) <= keywords and instructions[0] == "FROM"
    entrypoint = next(line for line in lines if line.startswith("ENTRYPOINT"))
    assert json.loads(entrypoint.removeprefix("ENTRYPOINT")) == ["/opt/mlxcel/.venv/bin/mlxcel", "serve"]
    assert "make install" in " ".join(lines)
    assert re.search(r"^install:", (ROOT / "Makefile").read_text(), re.M)


def test_docker_healthcheck_asks_the_configured_port(target_only_server) -> None:
    """The HEALTHCHECK command, run as Docker would (the venv's python, the container's env), passes
    on the port the profile and environment name, and fails on another."""
    line = next(line for line in (DEPLOY / "Dockerfile").read_text().splitlines() if line.startswith("HEALTHCHECK"))
    command = json.loads(line.split(" CMD ", 1)[1])
    assert command[0] == "/opt/mlxcel/.venv/bin/python"
    port = target_only_server.url.rsplit(":", 1)[1]
    for env_port, healthy in ((port, True), (str(free_port()), False)):
        env = clean_env(MLXCEL_PROFILE="target-only", MLXCEL_SERVER__PORT=env_port)
        result = subprocess.run([sys.executable, *command[1:]], env=env, cwd=ROOT, capture_output=True, timeout=60)
        assert (result.returncode == 0) == healthy, result.stderr


def test_nginx_example_fronts_two_replicas() -> None:
    text = (DEPLOY / "nginx.conf").read_text()
    body = re.sub(r"#.*", "", text)
    assert body.count("{") == body.count("}")
    upstream = re.search(r"upstream mlxcel \{(.*?)\}", body, re.S).group(1)
    assert len(re.findall(r"^\s*server 127\.0\.0\.1:\d+", upstream, re.M)) == 2
    assert "proxy_buffering off;" in body and "proxy_pass http://mlxcel;" in body
    if shutil.which("nginx"):
        result = subprocess.run(["nginx", "-t", "-c", str(DEPLOY / "nginx.conf")], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr


def test_console_script_is_installed() -> None:
    assert (Path(sys.executable).parent / "mlxcel").exists()
