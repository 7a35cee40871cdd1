"""OpenAI's chat answers: the body (one choice per row, a tool call's `tool_calls`, the thinking
as `reasoning_content`) and the stream's chunks."""

from __future__ import annotations

from typing import Literal

import msgspec
from msgspec import UNSET, UnsetType

from app.server.chat.reasoning import Reasoning, split
from app.server.chat.tools import ToolCall, ToolPlan, tool_calls, uncalled_text
from app.server.core.logprobs import ChatLogprobs, Logprobs
from app.server.core.shaping import prompt_progress, speculative_biased
from app.server.engine_view import Finished, Progress, Timings
from app.server.openai.shapes import (
    ChoiceUpdate,
    OpenAIChunk,
    OpenAIHead,
    OpenAIObject,
    Usage,
    body_timings,
    finish_reason,
    usage,
)


class AssistantMessage(msgspec.Struct, kw_only=True):
    role: Literal["assistant"] = "assistant"
    content: str | None  # None when the answer is tool calls
    reasoning_content: str | UnsetType = UNSET  # the answer's thinking block (reasoning_format)
    tool_calls: list[ToolCall] | UnsetType = UNSET


class ChatChoice(msgspec.Struct, kw_only=True):
    index: int = 0
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str


class ChatCompletion(OpenAIObject, kw_only=True):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage
    timings: Timings | UnsetType = UNSET  # left out when the body holds several rows (n > 1)
    speculative_biased: bool | UnsetType = UNSET  # a drafter ran: did the stream follow the argmax at T > 0?


class FunctionCallDelta(msgspec.Struct, kw_only=True):
    name: str | UnsetType = UNSET  # on a call's first chunk
    arguments: str  # a fragment of the arguments' JSON text ("" on the first chunk)


class ToolCallDelta(msgspec.Struct, kw_only=True):
    """A streamed call's piece: `index` ties the pieces of one call; id and type come first."""

    index: int
    id: str | UnsetType = UNSET
    type: Literal["function"] | UnsetType = UNSET
    function: FunctionCallDelta


class ChatDelta(msgspec.Struct, kw_only=True):
    """The role on the first chunk (content null, as llama-server), text or call pieces on the
    next ones, nothing on the finish chunk."""

    role: Literal["assistant"] | UnsetType = UNSET
    content: str | UnsetType | None = UNSET
    reasoning_content: str | UnsetType = UNSET
    tool_calls: list[ToolCallDelta] | UnsetType = UNSET


class ChatChunkChoice(msgspec.Struct, kw_only=True):
    index: int = 0
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None


class ChatCompletionChunk(OpenAIChunk, kw_only=True):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]


def chat_chunk(
    head: OpenAIHead, update: ChoiceUpdate, usage: Usage | UnsetType = UNSET, timings: Timings | UnsetType = UNSET
) -> ChatCompletionChunk:
    """An update chunk (text, and its tokens' log-probabilities) or the finish chunk (reason, an
    empty delta) of one choice."""
    delta = ChatDelta() if update.text is None else ChatDelta(content=update.text)
    choice = ChatChunkChoice(index=update.index, delta=delta, logprobs=update.logprobs, finish_reason=update.reason)
    return _chat_chunk(head, choice, usage, timings)


# A streamed call's arguments go out in pieces of this many characters, as OpenAI streams them
ARGUMENT_PIECE = 32


def tool_call_chunks(
    head: OpenAIHead, index: int, calls: list[ToolCall], logprobs: ChatLogprobs | None
) -> list[ChatCompletionChunk]:
    """Choice `index`'s calls as `delta.tool_calls` chunks: each call's id, type and name (with
    the calls' tokens' log-probabilities on the first), then its arguments in pieces."""
    chunks = []
    for number, call in enumerate(calls):
        head_piece = ToolCallDelta(
            index=number, id=call.id, type="function", function=FunctionCallDelta(name=call.function.name, arguments="")
        )
        pieces = [head_piece] + [
            ToolCallDelta(
                index=number, function=FunctionCallDelta(arguments=call.function.arguments[at : at + ARGUMENT_PIECE])
            )
            for at in range(0, len(call.function.arguments), ARGUMENT_PIECE)
        ]
        for piece in pieces:
            choice = ChatChunkChoice(
                index=index,
                delta=ChatDelta(tool_calls=[piece]),
                logprobs=None if chunks else logprobs,
                finish_reason=None,
            )
            chunks.append(_chat_chunk(head, choice))
    return chunks


def chat_reasoning_chunk(head: OpenAIHead, index: int, text: str, logprobs: ChatLogprobs | None) -> ChatCompletionChunk:
    """A piece of choice `index`'s thinking, as llama-server streams it: `delta.reasoning_content`."""
    choice = ChatChunkChoice(
        index=index, delta=ChatDelta(reasoning_content=text), logprobs=logprobs, finish_reason=None
    )
    return _chat_chunk(head, choice)


def chat_role_chunk(head: OpenAIHead, index: int = 0) -> ChatCompletionChunk:
    """The first chunk of choice `index`: the assistant's role, no text yet (null)."""
    delta = ChatDelta(role="assistant", content=None)
    return _chat_chunk(head, ChatChunkChoice(index=index, delta=delta, finish_reason=None))


def chat_progress_chunk(head: OpenAIHead, index: int, progress: Progress) -> ChatCompletionChunk:
    """A prefill progress chunk of choice `index`, as llama-server sends one: the role delta (no
    content yet) with `prompt_progress`."""
    return msgspec.structs.replace(chat_role_chunk(head, index), prompt_progress=prompt_progress(progress))


def _chat_chunk(
    head: OpenAIHead,
    choice: ChatChunkChoice,
    usage: Usage | UnsetType = UNSET,
    timings: Timings | UnsetType = UNSET,
) -> ChatCompletionChunk:
    return ChatCompletionChunk(
        id=head.id, created=head.created, model=head.model, choices=[choice], usage=usage, timings=timings
    )


def chat_choice(
    index: int, result: Finished, logprobs: ChatLogprobs | None, plan: ToolPlan | None, reasoning: Reasoning | None
) -> ChatChoice:
    """One choice: its thinking (with `reasoning`) and its text, or (content null, finish_reason
    tool_calls) the calls its text is."""
    thought, text = split(reasoning, result.text) if reasoning is not None else (None, result.text)
    shown = UNSET if thought is None else thought
    cut = result.stop_type == "limit"
    calls = tool_calls(plan, text, cut) if plan is not None else None
    if calls:  # a call the token limit cut is a call still, finish_reason "length" (OpenAI's)
        message = AssistantMessage(content=None, reasoning_content=shown, tool_calls=calls)
        reason = "length" if cut else "tool_calls"
        return ChatChoice(index=index, message=message, logprobs=logprobs, finish_reason=reason)
    message = AssistantMessage(content=uncalled_text(plan, text), reasoning_content=shown)
    return ChatChoice(index=index, message=message, logprobs=logprobs, finish_reason=finish_reason(result))


def chat_completion(
    head: OpenAIHead,
    results: list[Finished],
    logprobs: list[Logprobs | None],
    plan: ToolPlan | None = None,
    reasoning: Reasoning | None = None,
) -> ChatCompletion:
    """The body: one choice per row (the `n` choices of the one conversation), each with its row's
    `logprobs`; a choice whose output is a call of the `plan`'s tools answers it as `tool_calls`."""
    choices = [
        chat_choice(index, result, shaper.chat(result.logprobs) if shaper is not None else None, plan, reasoning)
        for index, (result, shaper) in enumerate(zip(results, logprobs, strict=True))
    ]
    return ChatCompletion(
        id=head.id,
        created=head.created,
        model=head.model,
        choices=choices,
        usage=usage(results, len(results)),
        timings=body_timings(results),
        speculative_biased=speculative_biased(results),
    )
