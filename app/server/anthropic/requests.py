"""Anthropic's Messages API request, and the request as a chat request.

A Messages request becomes a ChatRequest (app/server/chat/conversation.py runs it): `system` is the
first message, text blocks are joined, an assistant's `tool_use` blocks are its tool calls and
a user's `tool_result` blocks are tool messages, as chat templates read them. Tools become
function tools with `input_schema` as their parameters; `tool_choice` any/tool/none/auto map to
required/named/none/auto. `metadata`, `thinking`, `service_tier`, `container` and `mcp_servers`
(empty) are accepted as no-ops (docs/other-apis.md); `output_config.format` is decoded through the
grammar engine; images and documents are refused (text-only).
"""

from __future__ import annotations

from typing import Any

from app.server.chat.conversation import translated
from app.server.chat.request import ChatRequest
from app.server.chat.tools import type_name
from app.server.core.schemas import WireStruct
from app.server.errors import ApiError


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
