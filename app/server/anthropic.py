"""Anthropic's Messages API: its wire types, the request as a chat request, the answer and its events.

A Messages request becomes a ChatRequest (app/server/conversation.py runs it): `system` is the
first message, text blocks are joined, an assistant's `tool_use` blocks are its tool calls and
a user's `tool_result` blocks are tool messages, as chat templates read them. Tools become
function tools with `input_schema` as their parameters; `tool_choice` any/tool/none/auto map to
required/named/none/auto. `metadata`, `thinking`, `service_tier`, `container` and `mcp_servers`
(empty) are accepted as no-ops (docs/other-apis.md); `output_config.format` is decoded through the
grammar engine; images and documents are refused (text-only).
"""

from __future__ import annotations

import json
from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from app.server import shaping
from app.server.conversation import translated
from app.server.engine_view import Finished, Timings
from app.server.errors import ApiError
from app.server.schemas import ChatRequest, WireStruct
from app.server.tools import ToolPlan, tool_calls, type_name

# --- requests ---------------------------------------------------------------------------------


class Block(WireStruct, kw_only=True):
    """Any content block; which fields matter depends on `type`."""

    type: str
    text: str | None = None
    id: str | None = None  # tool_use
    name: str | None = None  # tool_use
    input: dict[str, Any] | None = None  # tool_use
    tool_use_id: str | None = None  # tool_result
    content: str | list[Block] | None = None  # tool_result
    is_error: bool | None = None  # tool_result


class Message(WireStruct, kw_only=True):
    role: str
    content: str | list[Block]


class AnthropicTool(WireStruct, kw_only=True):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None  # "custom" or absent; Anthropic's server tools (web search, ...) run nowhere here


class OutputFormat(WireStruct, kw_only=True):
    type: str
    schema: dict[str, Any] | None = None


class OutputConfig(WireStruct, kw_only=True):
    """`format`: the answer follows this JSON schema (the grammar engine); `effort`: the chat
    template's `reasoning_effort`, as the chat route passes OpenAI's."""

    format: OutputFormat | None = None
    effort: str | None = None


class MessagesRequest(WireStruct, kw_only=True):
    """POST /v1/messages (and, without max_tokens, /v1/messages/count_tokens)."""

    messages: list[Message]
    model: str | None = None
    max_tokens: int | None = None  # required by Anthropic; left out: the profile's n_predict
    system: str | list[Block] | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: dict[str, Any] | None = None
    mcp_servers: list[Any] | None = None
    output_config: OutputConfig | None = None
    # no-ops: metadata (a user id), thinking, service_tier, container: ignored as unknown fields are


SAMPLING = ("temperature", "top_p", "top_k", "stream")


def chat_request(request: MessagesRequest) -> ChatRequest:
    """The Messages request as the chat route's request (tools, grammar and sampling included)."""
    if request.mcp_servers:
        raise ApiError(400, "mcp_servers: not supported: this server connects to no MCP servers")
    messages = ([{"role": "system", "content": system_text(request.system)}] if request.system else []) + [
        entry for index, message in enumerate(request.messages) for entry in chat_messages(index, message)
    ]
    body: dict[str, Any] = {name: getattr(request, name) for name in SAMPLING if getattr(request, name) is not None}
    body |= {"messages": messages, "model": request.model, "max_tokens": request.max_tokens}
    body["stop"] = request.stop_sequences
    if request.tools:
        body["tools"] = [chat_tool(index, tool) for index, tool in enumerate(request.tools)]
    if request.tool_choice is not None:
        body["tool_choice"] = tool_choice(request.tool_choice)
        if request.tool_choice.get("disable_parallel_tool_use") is True:  # Anthropic's default: several uses
            body["parallel_tool_calls"] = False
    if request.output_config is not None:
        body |= output_config(request.output_config)
    return translated(body, "Messages")


def output_config(config: OutputConfig) -> dict[str, Any]:
    fields: dict[str, Any] = {"reasoning_effort": config.effort}
    if config.format is not None:
        if config.format.type != "json_schema" or config.format.schema is None:
            raise ApiError(400, 'output_config.format: expected {"type": "json_schema", "schema": {...}}')
        fields["json_schema"] = config.format.schema
    return fields


def system_text(system: str | list[Block] | None) -> str:
    if isinstance(system, str):
        return system
    return "".join(text_of(f"system[{i}]", block) for i, block in enumerate(system or []))


def text_of(where: str, block: Block) -> str:
    if block.type != "text":
        raise ApiError(400, f"{where}: a {block.type!r} block is not supported here: this server runs text-only models")
    return block.text or ""


def chat_messages(index: int, message: Message) -> list[dict[str, Any]]:
    """One Messages turn as chat messages: tool results become `tool` messages before the user's text."""
    where = f"messages[{index}]"
    if message.role not in ("user", "assistant"):
        raise ApiError(400, f'{where}.role: must be "user" or "assistant", got {message.role!r}')
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    texts, calls, results = [], [], []
    for position, block in enumerate(message.content):
        at = f"{where}.content[{position}]"
        if block.type == "tool_use" and message.role == "assistant":
            function = {"name": block.name, "arguments": block.input or {}}
            calls.append({"id": block.id, "type": "function", "function": function})
        elif block.type == "tool_result" and message.role == "user":
            results.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": result_text(at, block)})
        elif block.type in ("thinking", "redacted_thinking") and message.role == "assistant":
            continue  # an earlier answer's reasoning: not shown to the template again
        else:
            texts.append(text_of(at, block))
    turn: list[dict[str, Any]] = []
    if texts or calls:
        turn.append({"role": message.role, "content": "".join(texts)} | ({"tool_calls": calls} if calls else {}))
    return results + turn


def result_text(where: str, block: Block) -> str:
    content = block.content
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(text_of(f"{where}.content[{i}]", part) for i, part in enumerate(content))


def chat_tool(index: int, tool: AnthropicTool) -> dict[str, Any]:
    if tool.type not in (None, "custom"):
        raise ApiError(400, f"tools[{index}]: {tool.type!r} is one of Anthropic's server tools; only custom tools run")
    function = {"name": tool.name, "description": tool.description, "parameters": tool.input_schema}
    return {"type": "function", "function": function}


def tool_choice(choice: dict[str, Any]) -> str | dict[str, Any]:
    kind = choice.get("type")
    if kind in ("auto", "none"):
        return kind
    if kind == "any":
        return "required"
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise ApiError(400, f"tool_choice.name: expected a string, got {type_name(choice.get('name'))}")
        return {"type": "function", "function": {"name": choice["name"]}}
    raise ApiError(400, f"tool_choice.type must be one of auto, any, tool, none, got {kind!r}")


# --- answers ----------------------------------------------------------------------------------


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
    calls = tool_calls(plan, result.text) if plan is not None else None
    if calls:
        return [ToolUseBlock(id=call.id.replace("call_", "toolu_", 1), name=call.function.name,
                             input=json.loads(call.function.arguments)) for call in calls]  # fmt: skip
    return [TextBlock(text=result.text)]


def stop_reason(result: Finished, blocks: list[TextBlock | ToolUseBlock]) -> tuple[str, str | None]:
    """Anthropic's stop_reason and stop_sequence."""
    if isinstance(blocks[0], ToolUseBlock):
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
        speculative_biased=shaping.speculative_biased([result]),
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
    biased = shaping.speculative_biased([result])
    if biased is not UNSET:
        delta["speculative_biased"] = biased
    return [event(delta), event({"type": "message_stop"})]


def error_event(kind: str, text: str) -> bytes:
    return event({"type": "error", "error": {"type": kind, "message": text}})
