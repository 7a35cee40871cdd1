"""OpenAI's streams: the chunks of the text and chat completions, each for one choice, then `[DONE]`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from app.sampling.logprobs import TokenLogprob
from app.server.chat.reasoning import Reasoning, ThinkingStream
from app.server.chat.request import ChatRequest
from app.server.chat.tools import CallStream, ToolPlan
from app.server.core.logprobs import Logprobs
from app.server.core.service import Rows
from app.server.core.shaping import speculative_biased
from app.server.core.streaming import error_frame, frame
from app.server.engine_view import Delta, Finished, Progress, Timings
from app.server.openai import chat_shapes, shapes
from app.server.openai.requests import OpenAICompletionRequest
from app.server.openai.shapes import ChoiceUpdate, OpenAIHead, Usage

DONE = b"data: [DONE]\n\n"

# shapes.text_completion or chat_shapes.chat_chunk: (head, one choice's update, usage, timings) -> chunk
OpenAIChunk = Callable[[OpenAIHead, ChoiceUpdate, Usage | UnsetType, Timings | UnsetType], Any]
# shapes.text_progress_chunk or chat_shapes.chat_progress_chunk: (head, choice index, progress) -> chunk
ProgressChunk = Callable[[OpenAIHead, int, Progress], Any]
# Logprobs.text or .chat of one row: a chunk's tokens' log-probabilities in the route's shape
LogprobShape = Callable[[list[TokenLogprob]], Any]


async def openai_frames(
    rows: Rows,
    per_token: bool,
    head: OpenAIHead,
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
                    yield frame(chat_shapes.chat_reasoning_chunk(head, index, thought, _shaped(shape, entries)))
                    entries = []
            text, entries = calls[index].feed(text, entries) if calls else (text, entries)
            if (calls or thinking) and not text and event.text:
                continue  # held back (it may be a call, or the start of a tag) or sent as thinking
            timings = event.timings if per_token and event.timings is not None else UNSET
            shaped = _shaped(shape, entries)
            yield frame(chunk(head, ChoiceUpdate(index, text, logprobs=shaped), UNSET, timings))
        elif isinstance(event, Finished):
            reason = shapes.finish_reason(event)
            if thinking:
                thought, rest = thinking[index].finish()
                if thought:
                    yield frame(chat_shapes.chat_reasoning_chunk(head, index, thought, None))
                held: list[TokenLogprob] = []
                if rest and calls:
                    rest, held = calls[index].feed(rest, [])  # held on, or released with what it held
                if rest or held:
                    yield frame(chunk(head, ChoiceUpdate(index, rest, logprobs=_shaped(shape, held)), UNSET, UNSET))
            cut = event.stop_type == "limit"
            found = calls[index].calls(cut) if calls else None
            if calls:
                text, entries = calls[index].release()
                shaped = _shaped(shape, entries)
                if found:
                    reason = "length" if cut else "tool_calls"
                    for piece in chat_shapes.tool_call_chunks(head, index, found, shaped):
                        yield frame(piece)
                elif text or shaped:
                    yield frame(chunk(head, ChoiceUpdate(index, text, logprobs=shaped), UNSET, UNSET))
            finished[index] = event
            everyone = len(finished) == len(rows.submissions)
            usage = shapes.usage([finished[i] for i in sorted(finished)], n) if everyone else UNSET
            last = chunk(head, ChoiceUpdate(index, None, reason), UNSET if usage_chunk else usage, event.timings)
            yield frame(msgspec.structs.replace(last, speculative_biased=speculative_biased([event])))
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


async def chat_frames(
    rows: Rows,
    data: ChatRequest,
    head: OpenAIHead,
    logprobs: list[Logprobs | None],
    plan: ToolPlan | None,
    thinking: Reasoning | None,
) -> AsyncIterator[bytes]:
    """Each choice's role chunk first (no timings), then the OpenAI chunks; `timings` on each
    finish chunk; a choice that may call tools streams its calls as `delta.tool_calls`."""
    for index in range(data.n):
        yield frame(chat_shapes.chat_role_chunk(head, index))
    logprob_shapes = [shaper.chat if shaper is not None else None for shaper in logprobs]
    calls = [CallStream(plan) for _ in rows.submissions] if plan is not None and plan.callable else None
    frames = openai_frames(
        rows,
        data.timings_per_token,
        head,
        chat_shapes.chat_chunk,
        chat_shapes.chat_progress_chunk,
        data.n,
        logprob_shapes,
        usage_chunk=include_usage(data.stream_options),
        calls=calls,
        thinking=[ThinkingStream(thinking) for _ in rows.submissions] if thinking is not None else None,
    )
    async for chunk in frames:
        yield chunk


async def echoed_frames(
    rows: Rows,
    data: OpenAICompletionRequest,
    head: OpenAIHead,
    echoes: list[str],
    logprobs: list[Logprobs | None],
) -> AsyncIterator[bytes]:
    """With echo, each choice's prompt text first; then the OpenAI chunks."""
    for index, echo in enumerate(echoes):
        if echo:
            yield frame(shapes.text_completion(head, ChoiceUpdate(index, echo)))
    logprob_shapes = [shaper.text if shaper is not None else None for shaper in logprobs]
    usage_chunk = include_usage(data.stream_options)
    frames = openai_frames(
        rows,
        data.timings_per_token,
        head,
        shapes.text_completion,
        shapes.text_progress_chunk,
        data.n,
        logprob_shapes,
        usage_chunk=usage_chunk,
    )
    async for chunk in frames:
        yield chunk
