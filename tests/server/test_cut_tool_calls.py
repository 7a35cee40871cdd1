"""A tool call the token limit cuts stays a tool call: decoded under `required` or a named tool,
or begun under `auto`, then stopped by max_tokens, it is answered in each API's calls with the
arguments written so far and the API's length finish (OpenAI "length", Anthropic "max_tokens",
Responses "incomplete", Ollama "length"), streamed and not; never as content."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

from app.engine import tool_probe
from app.loading.tool_calls import begun_calls, partial_json
from tests.server.test_structured_outputs import TOOLS
from tests.support.server import serve
from tests.support.tool_caller import build_tool_caller

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMES = ("get_weather", "get_time")


def test_a_cut_output_reads_as_the_calls_it_had_begun() -> None:
    cut = begun_calls('{"name": "get_weather", "arguments": {"city": "Pa', NAMES)
    assert [(c.name, c.arguments, c.text) for c in cut] == [("get_weather", {"city": "Pa"}, '{"city": "Pa')]
    assert begun_calls('{"name": "get_wea', NAMES)[0].name == "get_weather"  # the one name it can still be
    assert begun_calls('{"name": "get_', NAMES) is None  # either tool's
    assert begun_calls("{", NAMES) is None and begun_calls("{", NAMES[:1], known_name=True)[0].name == "get_weather"
    two = '<tool_call>{"name": "get_time", "arguments": {"zone": "UTC"}}</tool_call>\n<tool_call>{"name": "get_w'
    assert [c.name for c in begun_calls(two, NAMES)] == ["get_time", "get_weather"]
    assert begun_calls('{"answer": 4', NAMES) is None and begun_calls("def f", NAMES) is None  # no call begun
    assert partial_json('{"a": [1, 2.5, {"b": "x\\u00') == {"a": [1, 2.5, {"b": "x"}]}
    assert partial_json('{"a": 12') == {} and partial_json('{"a": tr') == {}  # a number or word that may go on


def written_so_far(cut: str, whole: str) -> bool:
    """`cut` is the start of the whole call's arguments, as the model wrote them (compact or not)."""
    value = json.loads(whole)
    return any(text.startswith(cut) for text in (json.dumps(value), json.dumps(value, separators=(",", ":"))))


def within(cut: dict, whole: dict) -> bool:
    """Each argument read from the cut call is the start of the whole call's."""
    return all(key in whole and str(whole[key]).startswith(str(value)) for key, value in cut.items())


def openai_call(client: openai.OpenAI, fields: dict, stream: bool) -> tuple[list[dict], str | None, str | None]:
    """(calls as {name, arguments}, finish_reason, content) of a chat answer, joined from its chunks when streamed."""
    if not stream:
        choice = client.chat.completions.create(**fields).choices[0]
        calls = [{"name": c.function.name, "arguments": c.function.arguments} for c in choice.message.tool_calls or []]
        return calls, choice.finish_reason, choice.message.content
    joined: dict[int, dict] = {}
    reason, content = None, None
    for chunk in client.chat.completions.create(**fields, stream=True):
        for choice in chunk.choices:
            reason = choice.finish_reason or reason
            if choice.delta.content:
                content = (content or "") + choice.delta.content
            for piece in choice.delta.tool_calls or []:
                call = joined.setdefault(piece.index, {"name": "", "arguments": ""})
                call["name"] += piece.function.name or ""
                call["arguments"] += piece.function.arguments or ""
    return [joined[i] for i in sorted(joined)], reason, content


def whole_and_cut(client: openai.OpenAI, fields: dict) -> tuple[dict, int]:
    """The whole call (its arguments) and the longest token limit that cuts it inside them."""
    answer = client.chat.completions.create(**fields, max_tokens=100)
    assert answer.choices[0].finish_reason == "tool_calls"
    (call,) = answer.choices[0].message.tool_calls
    whole = {"name": call.function.name, "arguments": call.function.arguments}
    for limit in range(answer.usage.completion_tokens - 1, 0, -1):
        (cut,) = client.chat.completions.create(**fields, max_tokens=limit).choices[0].message.tool_calls
        if cut.function.arguments not in ("", whole["arguments"]):
            return whole, limit
    raise AssertionError("no token limit cuts the call inside its arguments")


def check_every_api(server, fields: dict, tool_choice: dict | str) -> None:
    """The chat answer cut inside its call's arguments, through OpenAI chat, Responses and Messages,
    streamed and not, each a call with the arguments so far and its API's length finish."""
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    whole, limit = whole_and_cut(client, fields)
    for stream in (False, True):
        calls, reason, content = openai_call(client, fields | {"max_tokens": limit}, stream)
        assert reason == "length" and not content, stream
        ((call),) = calls
        assert call["name"] == whole["name"] and written_so_far(call["arguments"], whole["arguments"]), (stream, call)
        assert call["arguments"] != whole["arguments"]  # cut: not the whole call

    tool = fields["tools"][0]["function"]  # the same tool in each API's spelling: the same prompt
    responses_fields = {
        "model": "target",
        "input": fields["messages"],
        "tools": [{"type": "function", **tool}],
        "tool_choice": tool_choice if isinstance(tool_choice, str) else {"type": "function", "name": "get_weather"},
        "max_output_tokens": limit,
        "temperature": 0,
    }
    answer = client.responses.create(**responses_fields)
    (item,) = answer.output
    assert (answer.status, item.type, item.status, item.name) == ("incomplete", "function_call", "incomplete",
                                                                   "get_weather")  # fmt: skip
    assert written_so_far(item.arguments, whole["arguments"])
    events = list(client.responses.create(**responses_fields, stream=True))
    assert (
        events[-1].type == "response.incomplete"
    )  # OpenAI's event at the limit (the SDK's helper waits for .completed)
    streamed = events[-1].response
    assert streamed.status == "incomplete" and streamed.output[0].arguments == item.arguments

    messages = anthropic.Anthropic(base_url=server.url, api_key="unused")
    anthropic_fields = {
        "model": "target",
        "messages": fields["messages"],
        "tools": [{"name": tool["name"], "description": tool["description"], "input_schema": tool["parameters"]}],
        "tool_choice": {"type": "any"} if tool_choice == "required" else {"type": "auto"},
        "max_tokens": limit,
        "extra_body": {"temperature": 0},  # the SDK has no argument for it (docs/other-apis.md)
    }
    message = messages.messages.create(**anthropic_fields)
    (block,) = message.content
    assert (message.stop_reason, block.type, block.name) == ("max_tokens", "tool_use", "get_weather")
    assert within(block.input, json.loads(whole["arguments"]))
    with messages.messages.stream(**anthropic_fields) as events:
        final = events.get_final_message()
    assert final.stop_reason == "max_tokens" and final.content[0].input == block.input


def test_a_required_call_cut_by_max_tokens_is_a_call_on_every_api(default_server) -> None:
    fields = {"model": "target", "messages": ASK, "tools": TOOLS, "tool_choice": "required", "temperature": 0}
    check_every_api(default_server, fields, "required")
    # cut before the name tells the two tools apart: no call, and still no content
    client = openai.OpenAI(base_url=f"{default_server.url}/v1", api_key="unused")
    for stream in (False, True):
        calls, reason, content = openai_call(client, fields | {"max_tokens": 3}, stream)
        assert (calls, reason, content or "") == ([], "length", ""), stream


def test_a_named_call_cut_by_max_tokens_is_a_call(default_server) -> None:
    client = openai.OpenAI(base_url=f"{default_server.url}/v1", api_key="unused")
    named = {"type": "function", "function": {"name": "get_weather"}}
    fields = {"model": "target", "messages": ASK, "tools": TOOLS, "tool_choice": named, "temperature": 0}
    whole, limit = whole_and_cut(client, fields)
    for stream in (False, True):
        (call,), reason, content = openai_call(client, fields | {"max_tokens": limit}, stream)
        assert reason == "length" and not content and written_so_far(call["arguments"], whole["arguments"])


@pytest.fixture(scope="module")
def caller_server(tmp_path_factory):
    """A tiny model trained to call the probe's tool (tests/support/tool_caller.py): `auto` begins
    a call there, which the token limit can cut."""
    root = tmp_path_factory.mktemp("caller")
    with serve(root, "-m", str(build_tool_caller(root / "model"))) as server:
        yield server


@pytest.mark.slow
def test_an_auto_call_cut_by_max_tokens_is_a_call_on_every_api(caller_server) -> None:
    fields = {"model": "target", "messages": tool_probe.MESSAGES, "tools": [tool_probe.TOOL], "temperature": 0}
    check_every_api(caller_server, fields, "auto")


@pytest.mark.slow
def test_an_auto_call_cut_by_num_predict_is_a_call_on_ollamas_api(caller_server) -> None:
    """Ollama's API has no tool_choice: a call is `auto`'s. The probe's own tool as sent on the wire
    (Ollama's client reorders a tool's schema, a prompt the tiny model never saw)."""
    body = {"model": "m", "messages": tool_probe.MESSAGES, "tools": [tool_probe.TOOL], "stream": False}
    with caller_server.client() as http:
        whole = http.post("/api/chat", json=body | {"options": {"temperature": 0, "num_predict": 100}}).json()
        (call,) = whole["message"]["tool_calls"]
        for limit in range(whole["eval_count"] - 1, 0, -1):
            options = {"temperature": 0, "num_predict": limit}
            cut = http.post("/api/chat", json=body | {"options": options}).json()
            if cut["message"]["tool_calls"][0]["function"]["arguments"] not in ({}, call["function"]["arguments"]):
                break
        (begun,) = cut["message"]["tool_calls"]
        found = (cut["done_reason"], begun["function"]["name"], cut["message"]["content"])
        assert found == ("length", "get_weather", "")
        assert within(begun["function"]["arguments"], call["function"]["arguments"])
        with http.stream("POST", "/api/chat", json=body | {"options": options, "stream": True}) as response:
            lines = [json.loads(line) for line in response.iter_lines()]
    streamed = [c for line in lines for c in line["message"].get("tool_calls", [])]
    assert [c["function"]["arguments"] for c in streamed] == [begun["function"]["arguments"]]
    assert lines[-1]["done_reason"] == "length" and not "".join(line["message"]["content"] for line in lines)
