"""Server-sent events: the framing every streamed route shares, and the stream's headers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
from litestar.response import Stream

from app.server.core.service import Rows
from app.server.core.shaping import rule_header
from app.server.errors import envelope_body

HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def frame(payload: Any) -> bytes:
    return b"data: " + msgspec.json.encode(payload) + b"\n\n"


async def sse(rows: Rows, frames: AsyncIterator[bytes]) -> Stream:
    """The stream, once every row is built: its headers name the rule the rows run."""
    rules = await rows.started()
    return Stream(frames, media_type="text/event-stream", headers={**HEADERS, **rule_header(rules)})


def error_frame(code: int, message: str, kind: str) -> bytes:
    return b"data: " + envelope_body(code, message, kind) + b"\n\n"
