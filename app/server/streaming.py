"""Server-sent events: the framing, and the frame streams of the completion routes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
from litestar.response import Stream
from msgspec import UNSET, UnsetType

from app.server import shaping
from app.server.engine_view import Delta, Finished, Timings
from app.server.errors import envelope_body
from app.server.responses import Usage
from app.server.service import Rows

DONE = b"data: [DONE]\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
REQUEST_ID = "x-request-id"  # the request_id of this request's log events

# shaping.text_completion or shaping.chat_chunk:
# (head, choice index, text, finish reason, usage, timings) -> chunk
OpenAIChunk = Callable[[shaping.OpenAIHead, int, str | None, str | None, Usage | UnsetType, Timings | UnsetType], Any]


def frame(payload: Any) -> bytes:
    return b"data: " + msgspec.json.encode(payload) + b"\n\n"


def sse(frames: AsyncIterator[bytes], request_id: str) -> Stream:
    return Stream(frames, media_type="text/event-stream", headers={**HEADERS, REQUEST_ID: request_id})


def error_frame(code: int, message: str, kind: str) -> bytes:
    return b"data: " + envelope_body(code, message, kind) + b"\n\n"


async def native_frames(
    rows: Rows,
    prompts: list[str],
    *,
    return_tokens: bool,
    response_fields: list[str] | None,
) -> AsyncIterator[bytes]:
    """One frame per update, then each row's whole object (without the text already sent);
    every frame carries its prompt's `index`."""
    async for index, event in rows.stream():
        if isinstance(event, Delta):
            yield frame(shaping.native_chunk(event.text, event.tokens, event.timings, index))
        elif isinstance(event, Finished):
            yield frame(
                shaping.native_body(
                    event,
                    rows.settings[index],
                    prompts[index],
                    return_tokens=return_tokens,
                    streamed=True,
                    response_fields=response_fields,
                    index=index,
                )
            )
        else:
            yield error_frame(event.code, event.message, event.kind)


async def openai_frames(
    rows: Rows, per_token: bool, head: shaping.OpenAIHead, chunk: OpenAIChunk, n: int
) -> AsyncIterator[bytes]:
    """OpenAI chunks, each for one choice (`index`): one per update, then the choice's finish chunk
    with its timings; the last finish chunk carries the usage of all rows. Then [DONE]."""
    finished: dict[int, Finished] = {}
    async for index, event in rows.stream():
        if isinstance(event, Delta):
            timings = event.timings if per_token and event.timings is not None else UNSET
            yield frame(chunk(head, index, event.text, None, UNSET, timings))
        elif isinstance(event, Finished):
            finished[index] = event
            everyone = len(finished) == len(rows.submissions)
            usage = shaping.usage([finished[i] for i in sorted(finished)], n) if everyone else UNSET
            yield frame(chunk(head, index, None, shaping.finish_reason(event), usage, event.timings))
        else:
            yield error_frame(event.code, event.message, event.kind)
    yield DONE
