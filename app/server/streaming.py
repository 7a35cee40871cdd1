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
from app.server.responses import Usage
from app.server.service import Rows

DONE = b"data: [DONE]\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

# shaping.text_completion or shaping.chat_chunk:
# (head, choice index, text, finish reason, usage, timings, logprobs) -> chunk
OpenAIChunk = Callable[
    [shaping.OpenAIHead, int, str | None, str | None, Usage | UnsetType, Timings | UnsetType, Any], Any
]
# shaping.Logprobs.text or .chat of one row: a chunk's tokens' log-probabilities in the route's shape
LogprobShape = Callable[[list[TokenLogprob]], Any]


def frame(payload: Any) -> bytes:
    return b"data: " + msgspec.json.encode(payload) + b"\n\n"


async def sse(rows: Rows, frames: AsyncIterator[bytes]) -> Stream:
    """The stream, once every row is built: its headers name the rule the rows run."""
    rules = await rows.started()
    return Stream(frames, media_type="text/event-stream", headers={**HEADERS, **shaping.rule_header(rules)})


def error_frame(code: int, message: str, kind: str) -> bytes:
    return b"data: " + envelope_body(code, message, kind) + b"\n\n"


async def native_frames(
    rows: Rows,
    prompts: list[str],
    *,
    return_tokens: bool,
    response_fields: list[str] | None,
    logprobs: list[shaping.Logprobs | None],
) -> AsyncIterator[bytes]:
    """One frame per update (with its tokens' probabilities), then each row's whole object
    (without the text and probabilities already sent); every frame carries its prompt's `index`,
    and `logprobs` has one shaper per row."""
    async for index, event in rows.stream():
        if isinstance(event, Delta):
            shaper = logprobs[index]
            probabilities = shaper.native(event.logprobs) if shaper is not None and event.logprobs else UNSET
            yield frame(shaping.native_chunk(event.text, event.tokens, event.timings, index, probabilities))
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
    rows: Rows,
    per_token: bool,
    head: shaping.OpenAIHead,
    chunk: OpenAIChunk,
    n: int,
    logprobs: list[LogprobShape | None],
) -> AsyncIterator[bytes]:
    """OpenAI chunks, each for one choice (`index`): one per update (with its own tokens'
    log-probabilities when asked; `logprobs` has one shape per row), then the choice's finish
    chunk with its timings; the last finish chunk carries the usage of all rows. Then [DONE]."""
    finished: dict[int, Finished] = {}
    async for index, event in rows.stream():
        if isinstance(event, Delta):
            timings = event.timings if per_token and event.timings is not None else UNSET
            shape = logprobs[index]
            shaped = shape(event.logprobs) if shape is not None and event.logprobs else None
            yield frame(chunk(head, index, event.text, None, UNSET, timings, shaped))
        elif isinstance(event, Finished):
            finished[index] = event
            everyone = len(finished) == len(rows.submissions)
            usage = shaping.usage([finished[i] for i in sorted(finished)], n) if everyone else UNSET
            last = chunk(head, index, None, shaping.finish_reason(event), usage, event.timings, None)
            yield frame(msgspec.structs.replace(last, speculative_biased=shaping.speculative_biased([event])))
        else:
            yield error_frame(event.code, event.message, event.kind)
    yield DONE
