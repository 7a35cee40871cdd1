"""Shared fixtures: the embedded pair (loaded once) and tiny random models built on the fly."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.loading import EMBEDDED_DRAFTER, EMBEDDED_TARGET, LoadedModel, load_model
from ops.models.tiny import build_tiny_model


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
def default_server(tmp_path_factory: pytest.TempPathFactory):
    """The embedded default profile (classic draft model), shared by the server tests."""
    from tests.support.server import serve

    with serve(tmp_path_factory.mktemp("default-server")) as server:
        yield server


@pytest.fixture(scope="session")
def target_only_server(tmp_path_factory: pytest.TempPathFactory):
    from tests.support.server import serve

    with serve(tmp_path_factory.mktemp("target-only-server"), "--profile", "target-only") as server:
        yield server
