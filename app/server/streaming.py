"""Server-sent events framing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
from litestar.response import Stream

DONE = b"data: [DONE]\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
REQUEST_ID = "x-request-id"  # the request_id of this request's log events


def frame(payload: Any) -> bytes:
    return b"data: " + msgspec.json.encode(payload) + b"\n\n"


def error_frame(code: int, message: str, kind: str) -> bytes:
    return frame({"error": {"code": code, "message": message, "type": kind}})


def sse(frames: AsyncIterator[bytes], request_id: str) -> Stream:
    return Stream(frames, media_type="text/event-stream", headers={**HEADERS, REQUEST_ID: request_id})
