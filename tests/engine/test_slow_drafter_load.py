"""A block drafter's first load takes seconds; the HTTP event loop must not wait on it.

The load is made slow for real: once the server is up, the MTP drafter's config.json becomes a
named pipe, so the first MTP request's load blocks reading it until the test writes it.
"""

from __future__ import annotations

import errno
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from app.loading import EMBEDDED_TARGET
from tests.support.server import serve

MTP = Path(__file__).resolve().parents[2] / "models" / "mtp"
LOAD_S = 3.0  # how long the test keeps the drafter's load waiting on its config.json
PROBES = ("/health", "/props", "/metrics")
REQUEST = {"prompt": "def add(a, b):\n", "n_predict": 16, "temperature": 0}


def slow_mtp_profile(tmp: Path) -> tuple[Path, Path]:
    """A profile on a copy of the embedded MTP drafter (weights linked); returns (profile, drafter dir)."""
    drafter = tmp / "mtp"
    drafter.mkdir()
    (drafter / "model.safetensors").symlink_to(MTP / "model.safetensors")
    (drafter / "config.json").write_text((MTP / "config.json").read_text())
    profile = tmp / "slow-mtp.toml"
    profile.write_text(f'target = "{EMBEDDED_TARGET}"\n\n[drafter]\nkind = "mtp"\nmodel = "{drafter}"\n')
    return profile, drafter


def open_when_read(pipe: Path, timeout: float) -> int:
    """Open the pipe for writing once a reader has opened it (the drafter's load has begun)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:  # ENXIO: nobody reads it yet
            if exc.errno != errno.ENXIO or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def answer_time(url: str, path: str) -> float:
    """Seconds until the route answered 200, or infinity if it did not within 1 s."""
    started = time.monotonic()
    try:
        response = httpx.get(url + path, timeout=1.0)
    except httpx.TimeoutException:
        return float("inf")
    assert response.status_code == 200, (path, response.text)
    return time.monotonic() - started


def complete(url: str, request: dict) -> dict:
    response = httpx.post(url + "/completion", json=request, timeout=120)
    assert response.status_code == 200, response.text
    return response.json() | {"request_id": response.headers["x-request-id"]}


@pytest.mark.slow
def test_routes_answer_while_a_block_drafter_loads(tmp_path: Path) -> None:
    profile, drafter = slow_mtp_profile(tmp_path)
    with serve(tmp_path, "--profile", str(profile)) as server, ThreadPoolExecutor(2) as pool:
        pipe = tmp_path / "config.pipe"  # the plan has read the regular file at startup
        os.mkfifo(pipe)
        pipe.replace(drafter / "config.json")
        slow = pool.submit(complete, server.url, REQUEST)
        writer = open_when_read(drafter / "config.json", timeout=30)
        opened = time.monotonic()
        try:
            # Another request arrives while the load waits: its submit runs on the event loop.
            other = pool.submit(complete, server.url, REQUEST | {"n_predict": 4})
            time.sleep(0.3)
            waits = {path: answer_time(server.url, path) for path in PROBES}
            assert not slow.done(), "the load should still be waiting on config.json"
        finally:
            time.sleep(max(0.0, LOAD_S - (time.monotonic() - opened)))
            with os.fdopen(writer, "w") as config:
                config.write((MTP / "config.json").read_text())
        assert all(wait < 1.0 for wait in waits.values()), waits
        first, second = slow.result(timeout=120), other.result(timeout=120)
        assert first["timings"]["draft_rounds"] > 0 and second["tokens_predicted"] == 4
        loaded = server.wait_for_event("drafter_loaded", first["request_id"])
        assert loaded["seconds"] >= LOAD_S - 0.5  # the load really waited on the pipe
        again = complete(server.url, REQUEST)  # the drafter is loaded now: same text at temperature 0
        assert again["content"] == first["content"]
