"""The deployment files in ops/deploy parse, and refer to things that exist."""

from __future__ import annotations

import json
import plistlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from app.profiles import shipped_profiles
from app.profiles.schema import ServerSettings
from ops.bench.nginx import fronted, prepared
from ops.bench.spawn import free_port
from tests.support import ROOT
from tests.support.server import clean_env

DEPLOY = ROOT / "ops" / "deploy"
DRAIN_S = ServerSettings().drain_timeout_s


@pytest.mark.parametrize(
    ("template", "instance_name", "command"),
    [
        ("mlxcel@.service", "default", "serve --profile %i"),  # the instance is the profile
        ("mlxcel-replica@.service", "8081", "serve --port %i"),  # the instance is the port
    ],
)
def test_systemd_unit_verifies(tmp_path: Path, template: str, instance_name: str, command: str) -> None:
    unit = (DEPLOY / template).read_text().replace("/opt/mlxcel", str(ROOT))
    assert "ExecStart=/opt" not in unit and f"ExecStart={ROOT}/.venv/bin/mlxcel {command}" in unit
    instance = tmp_path / template.replace("@", f"@{instance_name}")
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


def test_nginx_recipe_balances_the_replica_units_ports(tmp_path: Path) -> None:
    body = re.sub(r"#.*", "", (DEPLOY / "nginx.conf").read_text())
    upstreams = dict(re.findall(r"upstream (\w+) \{(.*?)\}", body, re.S))
    assert set(upstreams) == {"mlxcel", "mlxcel_by_prefix"}
    for upstream in upstreams.values():
        ports = [int(port) for port in re.findall(r"^\s*server 127\.0\.0\.1:(\d+) max_fails", upstream, re.M)]
        # `systemctl enable --now mlxcel-replica@{8080..8082}`, from the default profile's port
        assert ports == list(range(8080, 8083)) and "zone " in upstream
    assert (
        "least_conn;" in upstreams["mlxcel"] and "hash $http_x_prefix_key consistent;" in upstreams["mlxcel_by_prefix"]
    )
    assert "proxy_buffering off;" in body and "proxy_pass http://$mlxcel_pool;" in body
    assert "proxy_next_upstream error timeout http_503 non_idempotent;" in body
    prepared([f"http://127.0.0.1:{port}" for port in (9001, 9002, 9003)], tmp_path)  # runs nginx -t
    assert (tmp_path / "nginx.conf").read_text().count("server 127.0.0.1:900") == 6


def test_nginx_without_a_live_replica_answers_the_error_envelope(tmp_path: Path) -> None:
    nowhere = [f"http://127.0.0.1:{free_port()}" for _ in range(3)]  # nothing listens there
    with fronted(nowhere, tmp_path) as url:
        response = httpx.post(f"{url}/completion", json={"prompt": "x"}, timeout=10)
    assert response.status_code == 503
    assert response.json() == {
        "error": {"code": 503, "message": "no replica is available", "type": "unavailable_error"}
    }


def test_kubernetes_manifest_probes_health_and_drains() -> None:
    service, deployment = yaml.safe_load_all((DEPLOY / "kubernetes.yaml").read_text())
    assert (service["kind"], deployment["kind"]) == ("Service", "Deployment")
    pod = deployment["spec"]["template"]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"] == pod["metadata"]["labels"]
    (container,) = pod["spec"]["containers"]
    env = {variable["name"]: variable["value"] for variable in container["env"]}
    assert env["MLXCEL_PROFILE"] in shipped_profiles() and env["MLXCEL_SERVER__HOST"] == "0.0.0.0"
    (port,) = container["ports"]
    assert (
        port["containerPort"] == int(env["MLXCEL_SERVER__PORT"])
        and service["spec"]["ports"][0]["targetPort"] == port["name"]
    )
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": port["name"]}
    assert "livenessProbe" not in container  # /health is 503 while loading and draining: not a liveness signal
    sleep, seconds = container["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep == "sleep" and pod["spec"]["terminationGracePeriodSeconds"] > int(seconds) + DRAIN_S


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


def test_console_script_is_installed() -> None:
    assert (Path(sys.executable).parent / "mlxcel").exists()
