"""OpenAI's Responses API request, and the request as a chat request.

A Responses request becomes a ChatRequest (app/server/chat/conversation.py runs it): `instructions`
is the first (system) message, `input` a string (one user message) or items (messages with
`input_text`/`output_text` parts, `function_call` and `function_call_output` items, which are a
chat's tool calls and tool messages), `max_output_tokens` the token limit, `text.format` the
response_format (json_schema through the grammar engine), function tools and `tool_choice` the
chat's. A stored response continues by `previous_response_id` (store.py).
"""

from __future__ import annotations

from typing import Any

from app.server.chat.conversation import translated
from app.server.chat.request import ChatRequest
from app.server.chat.tools import type_name
from app.server.core.schemas import WireStruct
from app.server.errors import ApiError


class TextFormat(WireStruct, kw_only=True):
    type: str = "text"
    name: str | None = None
    schema: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class TextConfig(WireStruct, kw_only=True):
    format: TextFormat | None = None
    verbosity: str | None = None  # no verbosity control: only "medium" (the default) is neutral


class ResponsesRequest(WireStruct, kw_only=True):
    """POST /v1/responses."""

    input: str | list[dict[str, Any]]
    model: str | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    text: TextConfig | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None  # left out: OpenAI's true, an answer may be several calls
    previous_response_id: str | None = None
    store: bool = True
    background: bool | None = None


def chat_request(request: ResponsesRequest, history: list[dict[str, Any]]) -> ChatRequest:
    """The request as the chat route's, after the stored conversation `history` it continues."""
    if request.background:
        raise ApiError(400, "background: not supported: answers are not kept to be fetched later; stream instead")
    if request.text is not None and request.text.verbosity not in (None, "medium"):
        raise ApiError(400, "text.verbosity: not supported: there is no verbosity control")
    system = [{"role": "system", "content": request.instructions}] if request.instructions else []
    body: dict[str, Any] = {
        "messages": system + history + input_messages(request.input),
        "model": request.model,
        "max_tokens": request.max_output_tokens,
        "stream": request.stream,
    }
    body |= {name: getattr(request, name) for name in ("temperature", "top_p") if getattr(request, name) is not None}
    if request.text is not None and request.text.format is not None:
        body["response_format"] = response_format(request.text.format)
    if request.tools:
        body["tools"] = [chat_tool(index, tool) for index, tool in enumerate(request.tools)]
    if request.tool_choice is not None:
        body["tool_choice"] = tool_choice(request.tool_choice)
    body["parallel_tool_calls"] = request.parallel_tool_calls
    return translated(body, "Responses")


def input_messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`input` as chat messages (consecutive function calls as one assistant turn's calls)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    return merged_calls([input_message(index, item) for index, item in enumerate(items)])


def merged_calls(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive assistant messages that are only calls, as one message with all the calls:
    parallel calls are one turn, as chat templates read them."""
    out: list[dict[str, Any]] = []
    for message in messages:
        previous = out[-1] if out else None
        if previous is not None and _only_calls(previous) and _only_calls(message):
            out[-1] = {**previous, "tool_calls": previous["tool_calls"] + message["tool_calls"]}
        else:
            out.append(message)
    return out


def _only_calls(message: dict[str, Any]) -> bool:
    return message["role"] == "assistant" and bool(message.get("tool_calls")) and not message["content"]


def input_message(index: int, item: dict[str, Any]) -> dict[str, Any]:
    where, kind = f"input[{index}]", item.get("type", "message")
    if kind == "function_call":
        call = {"id": text_field(item, "call_id", where), "type": "function",
                "function": {"name": text_field(item, "name", where),
                             "arguments": text_field(item, "arguments", where, "{}")}}  # fmt: skip
        return {"role": "assistant", "content": "", "tool_calls": [call]}
    if kind == "function_call_output":
        output = item.get("output")
        text = output if isinstance(output, str) else parts_text(f"{where}.output", output)
        return {"role": "tool", "tool_call_id": text_field(item, "call_id", where), "content": text}
    if kind != "message":
        raise ApiError(
            400,
            f"{where}.type: {kind!r} items are not supported (message, function_call, function_call_output)",
        )
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise ApiError(400, f"{where}.role: must be user, assistant, system or developer, got {role!r}")
    content = item.get("content")
    text = content if isinstance(content, str) else parts_text(f"{where}.content", content)
    return {"role": "system" if role == "developer" else role, "content": text}


def text_field(item: dict[str, Any], key: str, where: str, default: str | None = None) -> str:
    """`item[key]`, a string (required unless it has a `default`)."""
    value = item.get(key, default)
    if not isinstance(value, str):
        raise ApiError(400, f"{where}.{key}: expected a string, got {type_name(value)}")
    return value


def parts_text(where: str, parts: object) -> str:
    if not isinstance(parts, list):
        raise ApiError(400, f"{where}: expected a string or a list of text parts, got {type_name(parts)}")
    texts = []
    for position, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text") or not isinstance(part.get("text"), str):
            raise ApiError(400, f"{where}[{position}]: only text parts are supported (text-only models)")
        texts.append(part["text"])
    return "".join(texts)


def response_format(format_: TextFormat) -> dict[str, Any]:
    if format_.type == "json_schema":
        if format_.schema is None:
            raise ApiError(400, "text.format: json_schema needs a schema")
        return {"type": "json_schema", "json_schema": {"name": format_.name, "schema": format_.schema}}
    if format_.type in ("text", "json_object"):
        return {"type": format_.type}
    raise ApiError(400, f"text.format.type must be one of text, json_object, json_schema, got {format_.type!r}")


def chat_tool(index: int, tool: dict[str, Any]) -> dict[str, Any]:
    where = f"tools[{index}]"
    if tool.get("type") != "function":
        raise ApiError(400, f"{where}: only function tools run here, got type {tool.get('type')!r}")
    description, parameters = tool.get("description"), tool.get("parameters")
    if description is not None and not isinstance(description, str):
        raise ApiError(400, f"{where}.description: expected a string, got {type_name(description)}")
    if parameters is not None and not isinstance(parameters, dict):
        raise ApiError(400, f"{where}.parameters: expected a JSON schema (an object), got {type_name(parameters)}")
    function = {"name": text_field(tool, "name", where), "description": description, "parameters": parameters}
    return {"type": "function", "function": function}


def tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise ApiError(400, 'tool_choice: "none", "auto", "required" or {"type": "function", "name": ...}')
