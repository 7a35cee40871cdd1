"""Chat tools: which calls a request allows, the schema a forced call is decoded against, and
turning the output into OpenAI `tool_calls`.

`tool_choice` "required" or a named function constrains the output to one call object
`{"name": ..., "arguments": {...}}` (the `arguments` schema is the tool's `parameters`), or with
`parallel_tool_calls: true` to a JSON array of one or more, so the answer always parses. "auto"
(the default with tools) generates freely and reports calls only when the whole output is calls:
one object or an array of them, bare, or one or more `<tool_call>` blocks as Hermes-style chat
templates write them. "none" shows the tools to the template and never reports a call.

`parallel_tool_calls` left out is OpenAI's default, true: an answer may be several calls. With
`false` an answer is at most one call: an output of several reports its first. (llama-server's
default is false; OpenAI's clients send nothing and expect OpenAI's.) A forced answer stays one
call object unless the request says true, so a small model is never steered into an array.

Streamed, a choice's text is held back while it may still become calls (CallStream), so a
client never sees a call's JSON as content. An output the token limit cut while it was a call
(forced, or `auto`'s once the call's name began) is answered as that call, its arguments as far as
they got, with the API's length finish ("length", "max_tokens", "incomplete"): never as content.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from app.loading.tool_calls import begun_calls, call_objects, is_call, may_become_calls, partial_json
from app.sampling.logprobs import TokenLogprob
from app.server.chat.request import ChatRequest, Tool
from app.server.errors import ApiError


class FunctionCall(msgspec.Struct, kw_only=True):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(msgspec.Struct, kw_only=True):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


@dataclass(frozen=True)
class ToolPlan:
    """The tools a request shows its template, and which calls its output may become."""

    tools: list[Tool]
    forced: bool  # required or named: the output is decoded against `schema`
    callable: tuple[str, ...]  # names a reported call may carry (empty: "none")
    parallel: bool = False  # parallel_tool_calls true: a forced answer is an array of one or more calls
    single: bool = False  # parallel_tool_calls false: an answer reports at most one call

    def schema(self) -> dict[str, Any]:
        """One call object of any callable tool, or an array of them when calls may be parallel."""
        by_name = {tool.function.name: tool for tool in self.tools}
        options = [call_schema(name, by_name[name].function.parameters) for name in self.callable]
        one = options[0] if len(options) == 1 else {"anyOf": options}
        return {"type": "array", "items": one, "minItems": 1} if self.parallel else one

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
    parallel, single = request.parallel_tool_calls is True, request.parallel_tool_calls is False
    if choice == "none":
        return ToolPlan(request.tools, forced=False, callable=())
    if choice in (None, "auto"):
        return ToolPlan(request.tools, forced=False, callable=names, parallel=parallel, single=single)
    if choice == "required":
        return ToolPlan(request.tools, forced=True, callable=names, parallel=parallel, single=single)
    if isinstance(choice, dict):
        function = choice.get("function")
        if not isinstance(function, dict):
            raise ApiError(400, f"tool_choice.function: expected an object {{name}}, got {type_name(function)}")
        name = function.get("name")
        if choice.get("type") != "function" or name not in names:
            raise ApiError(400, "tool_choice: name one of the given functions, as {type: function, function: {name}}")
        return ToolPlan(request.tools, forced=True, callable=(name,), parallel=parallel, single=single)
    raise ApiError(400, f"tool_choice must be none, auto, required or a named function, got {choice!r}")


def forced_schema(plan: ToolPlan | None) -> dict[str, Any] | None:
    """The schema a forced call is decoded against (the rows' grammar: core.service.start_rows);
    None where the output is free."""
    return plan.schema() if plan is not None and plan.forced else None


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


def tool_calls(plan: ToolPlan, text: str, cut: bool = False) -> list[ToolCall] | None:
    """The output as OpenAI tool_calls (the first only where the plan allows one), or None when it
    is not wholly calls of callable tools.

    `cut`: the token limit stopped the output. A call it had begun (a forced one always has; `auto`'s
    once its name began) is still a call, with the arguments written so far as their text is, cut
    (OpenAI's `arguments` at finish_reason "length"); `arguments_object` reads them as an object."""
    objects = call_objects(text)
    if objects and all(is_call(call, plan.callable) for call in objects):
        found = [(call["name"], json.dumps(call["arguments"], ensure_ascii=False)) for call in objects]
    elif cut and plan.callable:
        begun = begun_calls(text, plan.callable, known_name=plan.forced)
        if begun is None:
            return None
        found = [(call.name, call.text) for call in begun]
    else:
        return None
    if plan.single:
        found = found[:1]
    return [
        ToolCall(id=f"call_{uuid.uuid4().hex[:24]}", function=FunctionCall(name=name, arguments=arguments))
        for name, arguments in found
    ]


def uncalled_text(plan: ToolPlan | None, text: str) -> str:
    """An answer's text where it is no call: none under a forced plan, whose output is only ever a
    call (one cut before its tool could be told apart is no call, and still not content)."""
    return "" if plan is not None and plan.forced else text


def arguments_object(call: ToolCall) -> dict[str, Any]:
    """A call's arguments as an object, for the APIs that send them so (Anthropic's `input`,
    Ollama's `arguments`): a cut call's as far as they got (app/loading/tool_calls.py `partial_json`)."""
    try:
        value = json.loads(call.function.arguments)
    except ValueError:
        value = partial_json(call.function.arguments)
    return value if isinstance(value, dict) else {}


class CallStream:
    """One streamed choice's text and log-probabilities, held back while they may become calls.

    A forced plan's output is always calls; `auto`'s is held only while `may_become_calls`, then
    passes through as content. At the end the held text is calls, or content after all.
    """

    def __init__(self, plan: ToolPlan) -> None:
        self._plan = plan
        self._passing = not plan.callable
        self._text = ""
        self._logprobs: list[TokenLogprob] = []

    def feed(self, text: str, logprobs: list[TokenLogprob]) -> tuple[str, list[TokenLogprob]]:
        """What to send as content now."""
        if self._passing:
            return text, logprobs
        self._text += text
        self._logprobs += logprobs
        if self._plan.forced or may_become_calls(self._text):
            return "", []
        self._passing = True
        return self.release()

    def release(self) -> tuple[str, list[TokenLogprob]]:
        """The held text and log-probabilities, no longer held (a forced plan's text is never content)."""
        held = uncalled_text(self._plan, self._text), self._logprobs
        self._text, self._logprobs = "", []
        return held

    def calls(self, cut: bool = False) -> list[ToolCall] | None:
        """At the end: the held text as calls (`cut`: by the token limit, begun ones too: `tool_calls`),
        or None (it is content: `release` it)."""
        return None if self._passing else tool_calls(self._plan, self._text, cut)


def _function(tool: Tool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.function.name}
    if tool.function.description is not None:
        function["description"] = tool.function.description
    if tool.function.parameters is not None:
        function["parameters"] = tool.function.parameters
    return function
