"""Real servers for tests: `mlxcel serve` in a subprocess on a free port, its JSON log on disk."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from ops.bench.spawn import free_port

STARTUP_S = 90
API_KEY = "s3cret"  # the conftest's keyed_server


def die_with_parent() -> None:
    """In the child before it runs: the kernel sends SIGTERM when the worker that started it dies
    (an OOM kill of an xdist worker otherwise leaves its servers holding their memory)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without any MLXCEL_ setting or switch, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLXCEL_")}
    return env | extra


@dataclass
class RunningServer:
    url: str
    log: Path
    process: subprocess.Popen

    def client(self, **kw: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=120, **kw)

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        lines = [json.loads(line) for line in self.log.read_text().splitlines() if line.startswith("{")]
        return [e for e in lines if name is None or e.get("event") == name]

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Until no row is decoding: a shared server may still be retiring an earlier test's cancelled row."""
        deadline = time.monotonic() + timeout
        while any(slot["is_processing"] for slot in httpx.get(f"{self.url}/slots", timeout=10).json()):
            assert time.monotonic() < deadline, "a row is still decoding"
            time.sleep(0.05)

    def wait_for_event(self, name: str, request_id: str, timeout: float = 10.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [e for e in self.events(name) if e.get("request_id") == request_id]
            if found:
                return found[0]
            time.sleep(0.05)
        raise AssertionError(f"no {name} event for request {request_id}")


@contextmanager
def serve(tmp: Path, *args: str, env: dict[str, str] | None = None, port: int | None = None) -> Iterator[RunningServer]:
    """Start `mlxcel serve ARGS` on `port` (a free one by default); wait for /health 200; stop it afterwards."""
    port = port or free_port()
    log = tmp / f"server-{port}.log"
    output = tmp / f"server-{port}.out"  # a file, not a pipe nobody reads: a full pipe stalls the server
    environment = clean_env(MLXCEL_LOGGING__DESTINATION=str(log), **(env or {}))
    # the death signal follows the thread that started the child: only the main thread lives as
    # long as the worker (test_replicas starts its servers from a pool's threads)
    tied = sys.platform == "linux" and threading.current_thread() is threading.main_thread()
    with output.open("w") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "app", "serve", "--port", str(port), *args],
            env=environment,
            stdout=sink,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=die_with_parent if tied else None,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process, output)
        yield RunningServer(url, log, process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()


def wait_healthy(url: str, process: subprocess.Popen, output: Path | None = None) -> None:
    """Until /health answers 200; a process that exits first fails, with its output if `output` holds it."""
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            said = output.read_text() if output else "(see its output)"
            raise AssertionError(f"server exited with {process.returncode}: {said}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError("server did not become healthy")


def sse_frames(response: httpx.Response) -> list[Any]:
    """Parsed `data:` payloads of a server-sent-events response ("[DONE]" kept as a string)."""
    frames = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            frames.append(payload if payload == "[DONE]" else json.loads(payload))
    return frames
