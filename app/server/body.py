"""Reading JSON bodies strictly: invalid UTF-8 and excessive nesting are the client's error (400).

Litestar decodes a body with msgspec, whose UnicodeDecodeError and RecursionError are not
decoding errors to Litestar and would surface as 500s. The nesting limit is
`server.max_json_depth`, checked on the raw bytes before decoding so that a deep body costs no
decode; its maximum (512) stays below the depth where msgspec gives up (about 990).

Both the check and the decode take time in proportion to the body (bounded by
`server.max_body_bytes`), and both are linear in it: the check is a vectorised scan in slices of
SLICE bytes (a regular expression over strings was quadratic on unterminated strings of escapes:
64 KB held the event loop 35 s). A body over INLINE_BYTES is checked and decoded in a worker
thread, so the event loop serves on meanwhile.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
from litestar import Request
from litestar.serialization import decode_json
from litestar.types import Empty

from app.server.errors import ApiError

INLINE_BYTES = 64 * 1024  # bodies up to this are checked and decoded on the event loop (well under a millisecond)
SLICE = 256 * 1024  # bytes scanned at a time: the scan's arrays stay a few MB whatever the body
QUOTE, BACKSLASH = ord('"'), ord("\\")
STEP = np.zeros(256, dtype=np.int8)  # what each byte does to the depth outside strings
STEP[list(b"[{")] = 1
STEP[list(b"]}")] = -1


class StrictJsonRequest(Request):
    async def json(self) -> Any:
        if self._json is Empty and self._connection_state.json is Empty:
            body = await self.body()
            decoders = self.route_handler.resolve_type_decoders()
            limit = self.app.state.settings.server.max_json_depth
            if len(body) <= INLINE_BYTES:
                value = decoded(body, limit, decoders)
            else:
                value = await asyncio.to_thread(decoded, body, limit, decoders)
            self._json = self._connection_state.json = value
        return await super().json()


def decoded(body: bytes, limit: int, type_decoders: Any) -> Any:
    """The body as JSON values, or a 400 for nesting past `limit` or invalid UTF-8."""
    if deeper_than(body, limit):
        raise ApiError(400, too_deep_message(limit))
    try:
        return decode_json(body or b"null", type_decoders=type_decoders)
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"the request body is not valid UTF-8 (byte {exc.start})") from exc


def too_deep_message(limit: int) -> str:
    return f"the JSON body nests deeper than {limit} levels (server.max_json_depth)"


def deeper_than(body: bytes, limit: int) -> bool:
    """Whether arrays and objects in `body` nest more than `limit` levels.

    One pass, in slices: brackets inside strings do not count (a quote preceded by an odd run of
    backslashes is escaped), and the running count of openers minus closers peaks at the depth.
    Malformed JSON gives some answer; decoding refuses it.
    """
    if body.count(b"[") + body.count(b"{") <= limit:  # too few openers to nest that deep
        return False
    scan = DepthScan()
    view = memoryview(body)
    return any(scan.feed(view[start : start + SLICE]) > limit for start in range(0, len(body), SLICE))


class DepthScan:
    """The nesting depth of JSON text fed slice by slice, carrying what crosses a slice's end:
    the depth, whether it ends inside a string, and its trailing run of backslashes."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.backslashes = 0

    def feed(self, chunk: memoryview) -> int:
        """The deepest level reached within `chunk`."""
        data = np.frombuffer(chunk, dtype=np.uint8)
        others = np.flatnonzero(data != BACKSLASH)  # every byte but backslashes, in order
        quotes = np.flatnonzero(data == QUOTE)
        # the last byte before each quote that is no backslash (-1 - carried run: none in this slice)
        before = np.searchsorted(others, quotes) - 1
        last_other = np.where(before >= 0, others[np.maximum(before, 0)], -1 - self.backslashes)
        real = quotes[(quotes - last_other - 1) % 2 == 0]  # quotes an odd run of backslashes does not escape
        self.backslashes = int(len(data) - 1 - others[-1]) if len(others) else self.backslashes + len(data)
        brackets = np.flatnonzero(STEP[data])
        outside = (np.searchsorted(real, brackets) + self.in_string) % 2 == 0
        self.in_string = bool((len(real) + self.in_string) % 2)
        levels = self.depth + np.cumsum(STEP[data[brackets[outside]]], dtype=np.int64)
        deepest = int(levels.max(initial=self.depth))
        self.depth = int(levels[-1]) if len(levels) else self.depth
        return deepest
