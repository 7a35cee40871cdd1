"""Servers in subprocesses for the benchmarks: a free port, a clean environment, healthy."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

from app.drafters.kinds import DETECTED
from app.loading import read_checkpoint
from app.profiles.loader import file_layer, profile_path

REPO_ROOT = Path(__file__).resolve().parents[2]
STDERR_TAIL = 4000  # bytes of a failed server's stderr quoted in the error
STARTUP_S = 300  # a 1.2 B target's warm-up, with a dozen servers starting together on one GPU
# Backend switches that change how a forward or a draw runs, never what a profile serves: a bench
# run under one of them measures every arm with it (e.g. `MLXCEL_ROW_MMA=0 python -m ops.bench...` for the row kernel).
BACKEND_SWITCHES = ("MLXCEL_ROW_MMA", "MLXCEL_STACKED_DRAWS", "MLXCEL_COMPILED_SAMPLING")


@contextmanager
def spawned_server(
    profile: str, log: str = "stderr", args: Sequence[str] = (), env: Mapping[str, str] | None = None
) -> Iterator[tuple[str, subprocess.Popen]]:
    """`mlxcel serve --profile PROFILE [ARGS]` logging to `log`. The environment holds no MLXCEL_
    variable but the log's, `env`'s and the bench's own `BACKEND_SWITCHES`, so only the profile
    (and `args`, `env`) choose what is served. A server
    that does not serve the drafter kind the arm asked for (`expected_drafter`) is an error: its
    rows would be another arm's (issue 46: drafting arms once measured target-only)."""
    command = [sys.executable, "-m", "app", "serve", "--profile", profile, *args]
    switches = {name: os.environ[name] for name in BACKEND_SWITCHES if name in os.environ}
    environment = {"MLXCEL_LOGGING__DESTINATION": log, **switches, **(env or {})}
    with spawned(command, environment, f"log: {log}") as (url, process):
        require_drafter(url, f"--profile {profile} {' '.join(args)}".strip(), expected_drafter(profile, args, env))
        yield url, process


def detected_kind(model: str | Path) -> str:
    """The drafter kind a drafter checkpoint's config.json describes."""
    return str(DETECTED[read_checkpoint(model).kind])


def profile_drafter(profile: str) -> tuple[str, Path | None]:
    """The drafter kind and model a profile's file names (no environment, no flags)."""
    path = profile_path(profile)
    drafter = file_layer(path).get("drafter") or {}
    model = drafter.get("model") and (path.parent / drafter["model"]).resolve()
    kind = drafter.get("kind") or (detected_kind(model) if model else "none")
    return kind, model


def flag_value(args: Sequence[str], *names: str) -> str | None:
    args = list(args)
    return next((args[args.index(name) + 1] for name in names if name in args), None)


def expected_drafter(profile: str, args: Sequence[str] = (), env: Mapping[str, str] | None = None) -> str:
    """The drafter kind a server of `profile` must serve: `--draft-kind`'s, else the environment's,
    else the kind of a drafter model the flags or environment name, else the profile file's."""
    env = env or {}
    if kind := flag_value(args, "--draft-kind") or env.get("MLXCEL_DRAFTER__KIND"):
        return kind
    if model := flag_value(args, "-md", "--draft-model", "--model-draft") or env.get("MLXCEL_DRAFTER__MODEL"):
        return detected_kind(model)
    return profile_drafter(profile)[0]


def require_drafter(url: str, arm: str, expected: str) -> None:
    """The server at `url` drafts with `expected` (its /props); else RuntimeError naming both."""
    drafter = httpx.get(f"{url}/props", timeout=30).json()["mlxcel"]["drafter"]
    if drafter["kind"] != expected:
        raise RuntimeError(
            f"{arm}: the server drafts with {drafter['kind']!r} (model {drafter['model']}), not the {expected!r} "
            "the arm asks for; its rows would measure another arm"
        )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def spawned(command: list[str], env: dict[str, str], hint: str = "") -> Iterator[tuple[str, subprocess.Popen]]:
    """`command --port PORT` on a free port with only `env` (and PATH and HOME) set; its URL and
    process once /health answers 200; one that exits or never answers is a RuntimeError with the
    end of its stderr (a profile's startup error names the key and the models). `hint` says where
    to look for more. HOME because `mlx_lm.server` initialises `mx.distributed`, whose Open MPI
    aborts without it on the GPU machine."""
    port = free_port()
    with tempfile.TemporaryFile() as stderr:
        process = subprocess.Popen(
            [*command, "--port", str(port)],
            cwd=REPO_ROOT,
            env={"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"), **env},
            stdout=subprocess.DEVNULL,
            stderr=stderr,
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
                stderr.seek(max(0, stderr.seek(0, os.SEEK_END) - STDERR_TAIL))
                said = stderr.read().decode(errors="replace").strip()
                raise RuntimeError(
                    f"{command[2:]} did not become healthy (exit {process.poll()}); {hint}"
                    + (f"\n{said}" if said else "")
                )
            yield url, process
        finally:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:  # still draining: the measurement is done, so stop it
                process.kill()
                process.wait(30)
