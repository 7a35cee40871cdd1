"""`mlxcel serve` in a subprocess for the benchmarks: a free port, a clean environment, healthy."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]
STARTUP_S = 120


@contextmanager
def spawned_server(profile: str, log: str = "stderr") -> Iterator[tuple[str, subprocess.Popen]]:
    """`mlxcel serve --profile PROFILE` on a free port, logging to `log`; its URL and process once
    /health answers 200. The environment holds no MLXCEL_ variable, so only the profile counts."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {"MLXCEL_LOGGING__DESTINATION": log, "PATH": "/usr/bin:/bin"}
    command = [sys.executable, "-m", "app", "serve", "--profile", profile, "--port", str(port)]
    process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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
            raise RuntimeError(f"the server did not become healthy (exit {process.poll()}); log: {log}")
        yield url, process
    finally:
        process.terminate()
        process.wait(30)
