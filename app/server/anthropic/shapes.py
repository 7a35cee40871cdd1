"""Anthropic's Messages answers: the message body, its content blocks and the stream's events."""

from __future__ import annotations

import json
from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from app.server.chat.tools import ToolPlan, arguments_object, tool_calls, uncalled_text
from app.server.core.shaping import speculative_biased
from app.server.engine_view import Finished, Timings


class TextBlock(msgspec.Struct, kw_only=True, tag_field="type", tag="text"):
    text: str


class ToolUseBlock(msgspec.Struct, kw_only=True, tag_field="type", tag="tool_use"):
    id: str
    name: str
    input: dict[str, Any]


class AnthropicUsage(msgspec.Struct, kw_only=True):
    """As Anthropic counts: `input_tokens` excludes those read from the (prompt) cache."""

    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


class MessageBody(msgspec.Struct, kw_only=True):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[TextBlock | ToolUseBlock]
    stop_reason: str | None
    stop_sequence: str | None
    usage: AnthropicUsage
    timings: Timings | UnsetType = UNSET  # this server's own, as on the chat route
    speculative_biased: bool | UnsetType = UNSET


class TokenCount(msgspec.Struct, kw_only=True):
    input_tokens: int


def message_id(request_id: str) -> str:
    return f"msg_{request_id}"


def content(result: Finished, plan: ToolPlan | None) -> list[TextBlock | ToolUseBlock]:
    """The answer's blocks: the tool uses its whole output is (one unless several are allowed),
    or one block of its text."""
    calls = tool_calls(plan, result.text, result.stop_type == "limit") if plan is not None else None
    if calls:  # a use the token limit cut: its input as far as it got
        return [ToolUseBlock(id=call.id.replace("call_", "toolu_", 1), name=call.function.name,
                             input=arguments_object(call)) for call in calls]  # fmt: skip
    return [TextBlock(text=uncalled_text(plan, result.text))]


def stop_reason(result: Finished, blocks: list[TextBlock | ToolUseBlock]) -> tuple[str, str | None]:
    """Anthropic's stop_reason and stop_sequence (a tool use the limit cut: max_tokens)."""
    if isinstance(blocks[0], ToolUseBlock) and result.stop_type != "limit":
        return "tool_use", None
    if result.stop_type == "word":
        return "stop_sequence", result.stopping_word
    return ("max_tokens", None) if result.stop_type == "limit" else ("end_turn", None)


def usage(result: Finished) -> AnthropicUsage:
    cached = result.timings.cache_n
    return AnthropicUsage(
        input_tokens=result.prompt_n - cached, output_tokens=len(result.tokens), cache_read_input_tokens=cached
    )


def message(request_id: str, model: str, result: Finished, plan: ToolPlan | None) -> MessageBody:
    blocks = content(result, plan)
    reason, sequence = stop_reason(result, blocks)
    return MessageBody(
        id=message_id(request_id),
        model=model,
        content=blocks,
        stop_reason=reason,
        stop_sequence=sequence,
        usage=usage(result),
        timings=result.timings,
        speculative_biased=speculative_biased([result]),
    )


# --- stream events ------------------------------------------------------------------------------


def event(payload: dict[str, Any]) -> bytes:
    """One server-sent event, named by its payload's `type` as Anthropic sends them."""
    return b"event: " + payload["type"].encode() + b"\ndata: " + msgspec.json.encode(payload) + b"\n\n"


def message_start(request_id: str, model: str, prompt_tokens: int) -> bytes:
    empty = {"id": message_id(request_id), "type": "message", "role": "assistant", "model": model, "content": []}
    usage = {"input_tokens": prompt_tokens, "output_tokens": 0}
    return event({"type": "message_start", "message": empty | {"stop_reason": None, "stop_sequence": None,
                                                               "usage": usage}})  # fmt: skip


def block_start(index: int, block: TextBlock | ToolUseBlock) -> bytes:
    start = {"type": "text", "text": ""} if isinstance(block, TextBlock) else {
        "type": "tool_use", "id": block.id, "name": block.name, "input": {}
    }  # fmt: skip
    return event({"type": "content_block_start", "index": index, "content_block": start})


def text_delta(index: int, text: str) -> bytes:
    return event({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}})


def block_whole(index: int, block: TextBlock | ToolUseBlock) -> list[bytes]:
    """A block known whole (a held-back tool call, or its text): start, one delta, stop."""
    if isinstance(block, TextBlock):
        delta = text_delta(index, block.text)
    else:
        arguments = json.dumps(block.input, ensure_ascii=False)
        delta = event({"type": "content_block_delta", "index": index,
                       "delta": {"type": "input_json_delta", "partial_json": arguments}})  # fmt: skip
    return [block_start(index, block), delta, block_stop(index)]


def block_stop(index: int) -> bytes:
    return event({"type": "content_block_stop", "index": index})


def message_end(result: Finished, blocks: list[TextBlock | ToolUseBlock]) -> list[bytes]:
    reason, sequence = stop_reason(result, blocks)
    delta = {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
             "usage": msgspec.to_builtins(usage(result)), "timings": msgspec.to_builtins(result.timings)}  # fmt: skip
    biased = speculative_biased([result])
    if biased is not UNSET:
        delta["speculative_biased"] = biased
    return [event(delta), event({"type": "message_stop"})]


def error_event(kind: str, text: str) -> bytes:
    return event({"type": "error", "error": {"type": kind, "message": text}})
