"""Shared fixtures: the embedded pair (loaded once) and tiny random models built on the fly."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from app.loading import EMBEDDED_DRAFTER, EMBEDDED_TARGET, LoadedModel, load_model
from ops.models.tiny import build_tiny_model
from tests.support.server import API_KEY, RunningServer, serve


@pytest.fixture(scope="session")
def embedded_target() -> LoadedModel:
    return load_model(EMBEDDED_TARGET)


@pytest.fixture(scope="session")
def embedded_drafter() -> LoadedModel:
    return load_model(EMBEDDED_DRAFTER, role="drafter")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "qwen3")


@pytest.fixture(scope="session")
def tiny_model(tiny_dir: Path) -> LoadedModel:
    return load_model(tiny_dir)


@pytest.fixture(scope="session")
def profile_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], RunningServer]]:
    """`profile_server(name)`: one server per shipped profile, started on first use, shared by the
    session's tests and stopped at its end (a test that needs other flags starts its own)."""
    running: dict[str, RunningServer] = {}
    with ExitStack() as servers:

        def server_for(profile: str) -> RunningServer:
            if profile not in running:
                running[profile] = servers.enter_context(serve(tmp_path_factory.mktemp(profile), "--profile", profile))
            return running[profile]

        yield server_for


@pytest.fixture(scope="session")
def default_server(profile_server: Callable[[str], RunningServer]) -> RunningServer:
    """The embedded default profile (classic draft model), shared by the server tests."""
    return profile_server("default")


@pytest.fixture(scope="session")
def target_only_server(profile_server: Callable[[str], RunningServer]) -> RunningServer:
    return profile_server("target-only")


@pytest.fixture(scope="session")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """Target only behind `--api-key s3cret`, with small body and JSON-depth limits and a CORS origin
    list (one origin and a wildcard one) to test against."""
    env = {
        "MLXCEL_SERVER__MAX_BODY_BYTES": "4096",
        "MLXCEL_SERVER__MAX_JSON_DEPTH": "512",
        "MLXCEL_SERVER__CORS_ORIGINS": '["http://app.example", "https://*.example.org"]',
    }
    with serve(tmp_path_factory.mktemp("keyed"), "--profile", "target-only", "--api-key", API_KEY, env=env) as server:
        yield server
