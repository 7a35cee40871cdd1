"""Reading JSON bodies strictly: invalid UTF-8 and excessive nesting are the client's error (400).

Litestar decodes a body with msgspec, whose UnicodeDecodeError and RecursionError are not
decoding errors to Litestar and would surface as 500s. The nesting limit is
`server.max_json_depth`, checked on the raw bytes before decoding so that a deep body costs no
decode; its maximum (512) stays below the depth where msgspec gives up (about 990).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
from litestar import Request

from app.server.errors import ApiError

STRINGS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')  # a JSON string, escapes included
NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
OPENERS = np.frombuffer(b"[{", dtype=np.uint8)


class StrictJsonRequest(Request):
    async def json(self) -> Any:
        limit = self.app.state.settings.server.max_json_depth
        if deeper_than(await self.body(), limit):
            raise ApiError(400, too_deep_message(limit))
        try:
            return await super().json()
        except UnicodeDecodeError as exc:
            raise ApiError(400, f"the request body is not valid UTF-8 (byte {exc.start})") from exc


def too_deep_message(limit: int) -> str:
    return f"the JSON body nests deeper than {limit} levels (server.max_json_depth)"


def deeper_than(body: bytes, limit: int) -> bool:
    """Whether arrays and objects in `body` nest more than `limit` levels.

    Vectorised, as a body may hold millions of brackets: strings dropped, the running count of
    openers minus closers peaks at the depth. Malformed JSON gives some answer; decoding refuses it.
    """
    if body.count(b"[") + body.count(b"{") <= limit:  # too few openers to nest that deep
        return False
    brackets = np.frombuffer(STRINGS.sub(b"", body).translate(None, NOT_BRACKETS), dtype=np.uint8)
    steps = np.where(np.isin(brackets, OPENERS), 1, -1)
    return int(np.cumsum(steps).max(initial=0)) > limit
