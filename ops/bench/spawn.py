"""Servers in subprocesses for the benchmarks: a free port, a clean environment, healthy."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]
STARTUP_S = 120


def spawned_server(
    profile: str, log: str = "stderr", args: Sequence[str] = (), env: Mapping[str, str] | None = None
) -> AbstractContextManager[tuple[str, subprocess.Popen]]:
    """`mlxcel serve --profile PROFILE [ARGS]` logging to `log`. The environment holds no MLXCEL_
    variable but the log's and `env`'s, so only the profile (and `args`, `env`) count."""
    command = [sys.executable, "-m", "app", "serve", "--profile", profile, *args]
    return spawned(command, {"MLXCEL_LOGGING__DESTINATION": log, **(env or {})}, f"log: {log}")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def spawned(command: list[str], env: dict[str, str], hint: str = "") -> Iterator[tuple[str, subprocess.Popen]]:
    """`command --port PORT` on a free port with only `env` (and PATH and HOME) set; its URL and
    process once /health answers 200. `hint` says where to look when it never does. HOME because
    `mlx_lm.server` initialises `mx.distributed`, whose Open MPI aborts without it on the GPU machine."""
    port = free_port()
    process = subprocess.Popen(
        [*command, "--port", str(port)],
        cwd=REPO_ROOT,
        env={"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"), **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            raise RuntimeError(f"{command[2:]} did not become healthy (exit {process.poll()}); {hint}")
        yield url, process
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:  # still draining: the measurement is done, so stop it
            process.kill()
            process.wait(30)
