"""Server-sent events: the framing, and the frame streams of the completion routes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
from litestar.response import Stream
from msgspec import UNSET, UnsetType

from app.sampling.logprobs import TokenLogprob
from app.server import shaping
from app.server.engine_view import Delta, Finished, Progress, Timings
from app.server.errors import envelope_body
from app.server.reasoning import ThinkingStream
from app.server.responses import Usage
from app.server.service import Rows
from app.server.tools import CallStream

DONE = b"data: [DONE]\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

# shaping.text_completion or shaping.chat_chunk:
# (head, choice index, text, finish reason, usage, timings, logprobs) -> chunk
OpenAIChunk = Callable[
    [shaping.OpenAIHead, int, str | None, str | None, Usage | UnsetType, Timings | UnsetType, Any], Any
]
# shaping.text_progress_chunk or shaping.chat_progress_chunk: (head, choice index, progress) -> chunk
ProgressChunk = Callable[[shaping.OpenAIHead, int, Progress], Any]
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
    and `logprobs` has one shaper per row. Each frame counts its row's tokens so far, as llama-server's do.
    With return_progress, a row's prefill progress frames come before its first token."""
    predicted = [0] * len(rows.submissions)
    prompt_n = [len(request.prompt) for request in rows.row_requests]
    async for index, event in rows.stream():
        if isinstance(event, Progress):
            yield frame(shaping.native_progress_chunk(event, (predicted[index], prompt_n[index]), index))
        elif isinstance(event, Delta):
            shaper = logprobs[index]
            probabilities = shaper.native(event.logprobs) if shaper is not None and event.logprobs else UNSET
            predicted[index] += len(event.tokens)
            counts = (predicted[index], prompt_n[index])
            yield frame(shaping.native_chunk(event.text, event.tokens, event.timings, counts, index, probabilities))
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
    progress: ProgressChunk,
    n: int,
    logprobs: list[LogprobShape | None],
    *,
    usage_chunk: bool = False,
    calls: list[CallStream] | None = None,
    thinking: list[ThinkingStream] | None = None,
) -> AsyncIterator[bytes]:
    """OpenAI chunks, each for one choice (`index`): one per update (with its own tokens'
    log-probabilities when asked; `logprobs` has one shape per row), then the choice's finish
    chunk with its timings. The usage of all rows rides on the last finish chunk, or with
    `usage_chunk` (stream_options.include_usage) on a chunk of its own after it, with empty
    `choices` and the last row's timings, as OpenAI and llama-server send it. Then [DONE].

    With `calls` (chat with tools: one per row), a choice's text is held while it may become
    tool calls, and ends as their `delta.tool_calls` chunks with finish_reason `tool_calls`.
    With `thinking` (chat, reasoning parsed: one per row), a choice's thinking block goes out as
    `delta.reasoning_content` chunks (with its tokens' log-probabilities) before its content.
    With return_progress, a choice's prefill progress chunks (`progress`) come before its first token.
    """
    finished: dict[int, Finished] = {}
    async for index, event in rows.stream():
        shape = logprobs[index]
        if isinstance(event, Progress):
            yield frame(progress(head, index, event))
        elif isinstance(event, Delta):
            text, entries = event.text, event.logprobs
            if thinking:
                thought, text = thinking[index].feed(text)
                if thought:
                    yield frame(shaping.chat_reasoning_chunk(head, index, thought, _shaped(shape, entries)))
                    entries = []
            text, entries = calls[index].feed(text, entries) if calls else (text, entries)
            if (calls or thinking) and not text and event.text:
                continue  # held back (it may be a call, or the start of a tag) or sent as thinking
            timings = event.timings if per_token and event.timings is not None else UNSET
            shaped = _shaped(shape, entries)
            yield frame(chunk(head, index, text, None, UNSET, timings, shaped))
        elif isinstance(event, Finished):
            reason = shaping.finish_reason(event)
            if thinking:
                thought, rest = thinking[index].finish()
                if thought:
                    yield frame(shaping.chat_reasoning_chunk(head, index, thought, None))
                held: list[TokenLogprob] = []
                if rest and calls:
                    rest, held = calls[index].feed(rest, [])  # held on, or released with what it held
                if rest or held:
                    yield frame(chunk(head, index, rest, None, UNSET, UNSET, _shaped(shape, held)))
            found = calls[index].calls() if calls else None
            if calls:
                text, entries = calls[index].release()
                shaped = _shaped(shape, entries)
                if found:
                    reason = "tool_calls"
                    for piece in shaping.tool_call_chunks(head, index, found, shaped):
                        yield frame(piece)
                elif text or shaped:
                    yield frame(chunk(head, index, text, None, UNSET, UNSET, shaped))
            finished[index] = event
            everyone = len(finished) == len(rows.submissions)
            usage = shaping.usage([finished[i] for i in sorted(finished)], n) if everyone else UNSET
            last = chunk(head, index, None, reason, UNSET if usage_chunk else usage, event.timings, None)
            yield frame(msgspec.structs.replace(last, speculative_biased=shaping.speculative_biased([event])))
            if usage_chunk and everyone:
                yield frame(msgspec.structs.replace(last, choices=[], usage=usage))
        else:
            yield error_frame(event.code, event.message, event.kind)
    yield DONE


def _shaped(shape: LogprobShape | None, entries: list[TokenLogprob]) -> Any:
    return shape(entries) if shape is not None and entries else None


def include_usage(stream_options: dict[str, Any] | None) -> bool:
    """OpenAI's stream_options.include_usage: the usage in a chunk of its own at the end."""
    return bool(stream_options and stream_options.get("include_usage"))
