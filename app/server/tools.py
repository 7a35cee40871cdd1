"""Chat tools: which calls a request allows, the schema a forced call is decoded against, and
turning the output into OpenAI `tool_calls`.

`tool_choice` "required" or a named function constrains the output to one call object
`{"name": ..., "arguments": {...}}` (the `arguments` schema is the tool's `parameters`), so the
answer always parses. "auto" (the default with tools) generates freely and reports a call only
when the whole output is such an object, bare or inside `<tool_call>` tags as Hermes-style chat
templates write it. "none" shows the tools to the template and never reports a call.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from app.server.errors import ApiError
from app.server.responses import FunctionCall, ToolCall
from app.server.schemas import ChatRequest, Tool

TAGS = ("<tool_call>", "</tool_call>")


@dataclass(frozen=True)
class ToolPlan:
    """The tools a request shows its template, and which calls its output may become."""

    tools: list[Tool]
    forced: bool  # required or named: the output is decoded against `schema`
    callable: tuple[str, ...]  # names a reported call may carry (empty: "none")

    def schema(self) -> dict[str, Any]:
        """One call object of any callable tool."""
        by_name = {tool.function.name: tool for tool in self.tools}
        options = [call_schema(name, by_name[name].function.parameters) for name in self.callable]
        return options[0] if len(options) == 1 else {"anyOf": options}

    def template_tools(self) -> list[dict[str, Any]]:
        return [{"type": "function", "function": _function(tool)} for tool in self.tools]


def call_schema(name: str, parameters: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": name}, "arguments": parameters or {"type": "object"}},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def tool_plan(request: ChatRequest) -> ToolPlan | None:
    """The request's tool plan, or None without tools; what cannot be honoured is a 400."""
    choice = request.tool_choice
    if not request.tools:
        if choice in (None, "none", "auto"):
            return None
        raise ApiError(400, "tool_choice: no tools were given")
    names = tuple(tool.function.name for tool in request.tools)
    if any(tool.type != "function" for tool in request.tools):
        raise ApiError(400, 'tools: only tools of type "function" are supported')
    if len(set(names)) != len(names):
        raise ApiError(400, "tools: function names must be unique")
    for index, tool in enumerate(request.tools):
        check_parameters(index, tool.function.parameters)
    if choice == "none":
        return ToolPlan(request.tools, forced=False, callable=())
    if choice in (None, "auto"):
        return ToolPlan(request.tools, forced=False, callable=names)
    if choice == "required":
        return ToolPlan(request.tools, forced=True, callable=names)
    if isinstance(choice, dict):
        function = choice.get("function")
        if not isinstance(function, dict):
            raise ApiError(400, f"tool_choice.function: expected an object {{name}}, got {type_name(function)}")
        name = function.get("name")
        if choice.get("type") != "function" or name not in names:
            raise ApiError(400, "tool_choice: name one of the given functions, as {type: function, function: {name}}")
        return ToolPlan(request.tools, forced=True, callable=(name,))
    raise ApiError(400, f"tool_choice must be none, auto, required or a named function, got {choice!r}")


def check_parameters(index: int, parameters: dict[str, Any] | None) -> None:
    """A tool's parameters are the schema of its call's `arguments`, which are a JSON object:
    a schema of anything else could never be reported as a call."""
    if parameters is None:
        return
    kind = parameters.get("type", "object")
    if kind != "object":
        raise ApiError(400, f'tools[{index}].function.parameters: must be a JSON schema of type "object", got {kind!r}')


def check_count(request: ChatRequest, max_tools: int) -> None:
    if request.tools and len(request.tools) > max_tools:
        raise ApiError(400, f"tools: {len(request.tools)} tools; this server accepts {max_tools} (grammar.max_tools)")


def type_name(value: object) -> str:
    """JSON's name for a value's type, for error messages."""
    names = {str: "a string", list: "an array", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def tool_calls(plan: ToolPlan, text: str) -> list[ToolCall] | None:
    """The output as OpenAI tool_calls, or None when it is not one call of a callable tool."""
    body = text.strip()
    if body.startswith(TAGS[0]) and body.endswith(TAGS[1]):
        body = body[len(TAGS[0]) : -len(TAGS[1])].strip()
    try:
        call = json.loads(body)
    except ValueError:
        return None
    if not isinstance(call, dict) or set(call) != {"name", "arguments"} or call["name"] not in plan.callable:
        return None
    if not isinstance(call["arguments"], dict):
        return None
    function = FunctionCall(name=call["name"], arguments=json.dumps(call["arguments"], ensure_ascii=False))
    return [ToolCall(id=f"call_{uuid.uuid4().hex[:24]}", function=function)]


def _function(tool: Tool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.function.name}
    if tool.function.description is not None:
        function["description"] = tool.function.description
    if tool.function.parameters is not None:
        function["parameters"] = tool.function.parameters
    return function
