"""OpenAI's Responses API: its wire types, the request as a chat request, the answer and its events.

A Responses request becomes a ChatRequest (app/server/conversation.py runs it): `instructions`
is the first (system) message, `input` a string (one user message) or items (messages with
`input_text`/`output_text` parts, `function_call` and `function_call_output` items, which are a
chat's tool calls and tool messages), `max_output_tokens` the token limit, `text.format` the
response_format (json_schema through the grammar engine), function tools and `tool_choice` the
chat's. A stored response (`store`, the default) keeps its conversation, input and output, in
this process's memory, so a later request may continue it by `previous_response_id`; each
tenant has its own store, holding its last `server.responses_stored` responses within
`server.responses_store_mb` (its encoded conversations' bytes), so neither one tenant's traffic
evicts another's nor its size grows the server without bound.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from app.server import shaping
from app.server.conversation import translated
from app.server.engine_view import Finished, Timings
from app.server.errors import ApiError
from app.server.responses import GenerationSettings
from app.server.schemas import ChatRequest, WireStruct
from app.server.tools import ToolPlan, tool_calls, type_name

# --- requests ---------------------------------------------------------------------------------


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
    # no-ops: metadata, user, safety_identifier, prompt_cache_key, truncation, reasoning, include


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


# --- the store ----------------------------------------------------------------------------------


class ResponseStore:
    """Stored conversations, encoded, by tenant and response id: each tenant's last `entries`
    within `max_bytes`, the oldest going first. A conversation larger than `max_bytes` alone is
    not kept (a later `previous_response_id` naming it is not found)."""

    def __init__(self, entries: int, max_bytes: int) -> None:
        self._entries = entries
        self._max_bytes = max_bytes
        self._held: dict[str, OrderedDict[str, bytes]] = {}
        self._bytes: dict[str, int] = {}
        self._lock = threading.Lock()

    def history(self, tenant: str, response_id: str | None) -> list[dict[str, Any]]:
        if response_id is None:
            return []
        with self._lock:
            found = self._held.get(tenant, {}).get(response_id)
        if found is None:
            raise ApiError(400, f"Previous response with id '{response_id}' not found (responses are kept in memory, "
                                f"each tenant's last {self._entries} within {self._max_bytes} bytes, and only when "
                                "stored)")  # fmt: skip
        return msgspec.json.decode(found)

    def keep(self, tenant: str, response_id: str, conversation: list[dict[str, Any]]) -> None:
        encoded = msgspec.json.encode(conversation)
        if len(encoded) > self._max_bytes:
            return
        with self._lock:
            held = self._held.setdefault(tenant, OrderedDict())
            held[response_id] = encoded
            self._bytes[tenant] = self._bytes.get(tenant, 0) + len(encoded)
            while len(held) > self._entries or self._bytes[tenant] > self._max_bytes:
                _, dropped = held.popitem(last=False)
                self._bytes[tenant] -= len(dropped)


def conversation(data: ChatRequest, output: list[OutputItem]) -> list[dict[str, Any]]:
    """What a stored response continues from: its messages (not its instructions, which
    OpenAI does not carry over) and its output, as chat messages."""
    messages = [msgspec.to_builtins(m) for m in data.messages]
    if messages and messages[0]["role"] == "system":
        messages = messages[1:]  # instructions (input items' system messages are kept below)
    return merged_calls(messages + [output_message(item) for item in output])


def output_message(item: OutputItem) -> dict[str, Any]:
    if isinstance(item, FunctionCallItem):
        call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
        return {"role": "assistant", "content": "", "tool_calls": [call]}
    return {"role": "assistant", "content": "".join(part.text for part in item.content)}


# --- answers ----------------------------------------------------------------------------------


class OutputText(msgspec.Struct, kw_only=True, tag_field="type", tag="output_text"):
    text: str
    annotations: list[Any] = msgspec.field(default_factory=list)


class MessageItem(msgspec.Struct, kw_only=True, tag_field="type", tag="message"):
    id: str
    status: str
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


class FunctionCallItem(msgspec.Struct, kw_only=True, tag_field="type", tag="function_call"):
    id: str
    call_id: str
    name: str
    arguments: str
    status: str


OutputItem = MessageItem | FunctionCallItem


class InputTokensDetails(msgspec.Struct, kw_only=True):
    cached_tokens: int
    cache_write_tokens: int = 0


class OutputTokensDetails(msgspec.Struct, kw_only=True):
    reasoning_tokens: int = 0


class ResponsesUsage(msgspec.Struct, kw_only=True):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(msgspec.Struct, kw_only=True):
    reason: str


class ResponseBody(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: str
    error: None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None
    max_output_tokens: int | None
    model: str
    output: list[OutputItem]
    parallel_tool_calls: bool
    previous_response_id: str | None
    store: bool
    temperature: float
    top_p: float
    text: dict[str, Any]
    tool_choice: str | dict[str, Any]
    tools: list[dict[str, Any]]
    usage: ResponsesUsage | None
    timings: Timings | UnsetType = UNSET  # this server's own, as on the chat route
    speculative_biased: bool | UnsetType = UNSET


def response_id() -> str:
    return f"resp_{uuid.uuid4().hex}"


def output(result: Finished, plan: ToolPlan | None, item_id: str) -> list[OutputItem]:
    """The answer's items: the function calls its whole output is (several where
    parallel_tool_calls allows), or one message of its text."""
    calls = tool_calls(plan, result.text) if plan is not None else None
    if calls:
        return [FunctionCallItem(id=f"fc_{item_id}" + (f"_{i}" if i else ""), call_id=call.id,
                                 name=call.function.name, arguments=call.function.arguments, status="completed")
                for i, call in enumerate(calls)]  # fmt: skip
    return [MessageItem(id=f"msg_{item_id}", status=status(result), content=[OutputText(text=result.text)])]


def status(result: Finished | None) -> str:
    if result is None:
        return "in_progress"
    return "incomplete" if result.stop_type == "limit" else "completed"


def usage(result: Finished) -> ResponsesUsage:
    output_n = len(result.tokens)
    return ResponsesUsage(
        input_tokens=result.prompt_n,
        input_tokens_details=InputTokensDetails(cached_tokens=result.timings.cache_n),
        output_tokens=output_n,
        output_tokens_details=OutputTokensDetails(),
        total_tokens=result.prompt_n + output_n,
    )


def body(
    rid: str,
    request: ResponsesRequest,
    ran: GenerationSettings,
    created: int,
    result: Finished | None,
    items: list[OutputItem],
) -> ResponseBody:
    """The response object: in progress (no result yet) or done, with its output and usage."""
    incomplete = result is not None and result.stop_type == "limit"
    text_format = (
        {"type": "text"}
        if request.text is None or request.text.format is None
        else msgspec.to_builtins(request.text.format)
    )
    return ResponseBody(
        id=rid,
        created_at=created,
        status=status(result),
        incomplete_details=IncompleteDetails(reason="max_output_tokens") if incomplete else None,
        instructions=request.instructions,
        max_output_tokens=request.max_output_tokens,
        model=ran.model,
        output=items,
        parallel_tool_calls=request.parallel_tool_calls if request.parallel_tool_calls is not None else True,
        previous_response_id=request.previous_response_id,
        store=request.store,
        temperature=ran.temperature,  # as the row ran: the profile's default where the request left it out
        top_p=ran.top_p,
        text={"format": text_format},
        tool_choice=request.tool_choice if request.tool_choice is not None else "auto",
        tools=request.tools or [],
        usage=usage(result) if result is not None else None,
        timings=result.timings if result is not None else UNSET,
        speculative_biased=shaping.speculative_biased([result]) if result is not None else UNSET,
    )


def now() -> int:
    return int(time.time())


# --- stream events ------------------------------------------------------------------------------


class Events:
    """The numbered events of one streamed response (the SDK checks `sequence_number` order)."""

    def __init__(self) -> None:
        self.sequence = 0

    def event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + msgspec.json.encode(payload) + b"\n\n"

    def text_start(self, item_id: str) -> list[bytes]:
        item = MessageItem(id=f"msg_{item_id}", status="in_progress", content=[])
        return [
            self.event("response.output_item.added", output_index=0, item=item),
            self.event("response.content_part.added", item_id=item.id, output_index=0, content_index=0,
                       part=OutputText(text="")),
        ]  # fmt: skip

    def text_delta(self, item_id: str, text: str) -> bytes:
        return self.event("response.output_text.delta", item_id=f"msg_{item_id}", output_index=0, content_index=0,
                          delta=text, logprobs=[])  # fmt: skip

    def item_done(self, item: OutputItem, index: int = 0) -> list[bytes]:
        """A message's closing events, or a (held-back) function call's whole events, as output item `index`."""
        if isinstance(item, MessageItem):
            part = item.content[0]
            return [
                self.event("response.output_text.done", item_id=item.id, output_index=0, content_index=0,
                           text=part.text, logprobs=[]),
                self.event("response.content_part.done", item_id=item.id, output_index=0, content_index=0, part=part),
                self.event("response.output_item.done", output_index=0, item=item),
            ]  # fmt: skip
        started = msgspec.structs.replace(item, arguments="", status="in_progress")
        return [
            self.event("response.output_item.added", output_index=index, item=started),
            self.event("response.function_call_arguments.delta", item_id=item.id, output_index=index,
                       delta=item.arguments),
            self.event("response.function_call_arguments.done", item_id=item.id, output_index=index,
                       arguments=item.arguments),
            self.event("response.output_item.done", output_index=index, item=item),
        ]  # fmt: skip

    def error(self, code: int, message: str, kind: str) -> bytes:
        return self.event("error", code=kind, message=message, param=None, status=code)
