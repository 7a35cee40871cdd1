"""Non-streamed answer bodies: bounded by server.max_response_bytes, built off the event loop when large.

Shaping and encoding a body is CPU work in proportion to its size: the audit's 200 MB answer held
the event loop for 21 s, and /health with it. A body estimated large is shaped and encoded in a
worker thread (asyncio.to_thread) while the loop serves on; a small one, the common case, is
built inline, where the thread hop would cost more than the work.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
from litestar import Response
from litestar.enums import MediaType

from app.server.engine_view import Finished
from app.server.errors import ApiError

ENTRY_BYTES = 75  # about what one log-probability entry takes in JSON (token text, bytes, logprob; measured 74-81)
INLINE_BYTES = 64 * 1024  # bodies estimated smaller are built on the event loop (a few milliseconds at most)


def too_large(size: str, limit: int) -> ApiError:
    return ApiError(
        400,
        f"the answer would be {size}; this server sends at most {limit} bytes in one body "
        "(server.max_response_bytes): ask for fewer tokens, rows or log-probabilities, or stream it",
    )


async def json_response(
    build: Callable[[], Any], results: Sequence[Finished], texts: Sequence[str], limit: int, headers: dict[str, str]
) -> Response:
    """The body `build` shapes from `results`, encoded; `texts` are the other strings it repeats
    (the prompts, echoes). Its texts are known before building, so a body whose text alone
    passes `limit` is refused before any of it is shaped; the encoded body is checked whole."""
    chars = sum(len(result.text) for result in results) + sum(map(len, texts))
    if chars > limit:  # JSON takes at least a byte per character
        raise too_large(f"{chars} characters of text", limit)
    entries = sum(len(entry.top) + 1 for result in results for entry in result.logprobs)
    return await encoded_response(build, chars + entries * ENTRY_BYTES, limit, headers)


async def encoded_response(
    build: Callable[[], Any], estimate: int, limit: int, headers: dict[str, str] | None = None
) -> Response:
    """The body `build` shapes, encoded within `limit` bytes: on the event loop when `estimate`
    (its bytes, roughly) is small, in a worker thread otherwise."""
    if estimate < INLINE_BYTES:
        content = encoded(build, limit)
    else:
        content = await asyncio.to_thread(encoded, build, limit)
    return Response(content, media_type=MediaType.JSON, headers=headers)


def encoded(build: Callable[[], Any], limit: int) -> bytes:
    content = msgspec.json.encode(build())
    if len(content) > limit:
        raise too_large(f"{len(content)} bytes", limit)
    return content
