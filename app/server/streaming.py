"""Server-sent events: the framing, and the frame streams of the completion routes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
from litestar.response import Stream
from msgspec import UNSET, UnsetType

from app.sampling.logprobs import TokenLogprob
from app.server import shaping
from app.server.engine_view import Delta, Finished, Timings
from app.server.errors import envelope_body
from app.server.responses import GenerationSettings, Usage
from app.server.service import Submission

DONE = b"data: [DONE]\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
REQUEST_ID = "x-request-id"  # the request_id of this request's log events

# shaping.text_completion or shaping.chat_chunk: (head, text, finish reason, usage, timings, logprobs) -> chunk
OpenAIChunk = Callable[[shaping.OpenAIHead, str | None, str | None, Usage | UnsetType, Timings | UnsetType, Any], Any]
# shaping.Logprobs.text or .chat: a chunk's tokens' log-probabilities in the route's shape
LogprobShape = Callable[[list[TokenLogprob]], Any]


def frame(payload: Any) -> bytes:
    return b"data: " + msgspec.json.encode(payload) + b"\n\n"


def sse(frames: AsyncIterator[bytes], request_id: str) -> Stream:
    return Stream(frames, media_type="text/event-stream", headers={**HEADERS, REQUEST_ID: request_id})


def error_frame(code: int, message: str, kind: str) -> bytes:
    return b"data: " + envelope_body(code, message, kind) + b"\n\n"


async def native_frames(
    submission: Submission,
    settings: GenerationSettings,
    prompt: str,
    *,
    return_tokens: bool,
    response_fields: list[str] | None,
    logprobs: shaping.Logprobs | None = None,
) -> AsyncIterator[bytes]:
    """One frame per update (with its tokens' probabilities), then the whole object (without the
    text and probabilities already sent)."""
    async for event in submission.stream():
        if isinstance(event, Delta):
            probabilities = logprobs.native(event.logprobs) if logprobs is not None and event.logprobs else UNSET
            yield frame(shaping.native_chunk(event.text, event.tokens, event.timings, probabilities))
        elif isinstance(event, Finished):
            yield frame(
                shaping.native_body(
                    event, settings, prompt, return_tokens=return_tokens, streamed=True, response_fields=response_fields
                )
            )
        else:
            yield error_frame(event.code, event.message, event.kind)


async def openai_frames(
    submission: Submission,
    per_token: bool,
    head: shaping.OpenAIHead,
    chunk: OpenAIChunk,
    logprobs: LogprobShape | None = None,
) -> AsyncIterator[bytes]:
    """OpenAI chunks: one per update (with its tokens' log-probabilities when asked), then the
    finish chunk with usage and timings, then [DONE]."""
    async for event in submission.stream():
        if isinstance(event, Delta):
            timings = event.timings if per_token and event.timings is not None else UNSET
            shaped = logprobs(event.logprobs) if logprobs is not None and event.logprobs else None
            yield frame(chunk(head, event.text, None, UNSET, timings, shaped))
        elif isinstance(event, Finished):
            yield frame(chunk(head, None, shaping.finish_reason(event), shaping.usage(event), event.timings, None))
        else:
            yield error_frame(event.code, event.message, event.kind)
    yield DONE
