"""Fixtures of the engine tests."""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest
import structlog

from app.runtime.logging import configure_logging


@pytest.fixture
def log() -> Iterator[io.StringIO]:
    """The engine's JSON log lines, as the server would write them."""
    stream = io.StringIO()
    configure_logging("info", stream=stream)
    yield stream
    structlog.reset_defaults()
