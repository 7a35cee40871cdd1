"""Structured outputs over HTTP: OpenAI response_format, native json_schema and grammar, and 400s."""

from __future__ import annotations

import json

import msgspec
import openai
import pytest
from pydantic import BaseModel, Field

from app.server.chat.request import ChatRequest
from app.server.chat.tools import tool_calls, tool_plan

PROMPT = "Describe a person as JSON: "
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 12}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"zone": {"enum": ["UTC", "CET", "PST"]}},
                "required": ["zone"],
                "additionalProperties": False,
            },
        },
    },
]


class Person(BaseModel):
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=150)


def test_openai_sdk_parse_returns_the_pydantic_object(default_server) -> None:
    client = openai.OpenAI(base_url=f"{default_server.url}/v1", api_key="unused")
    messages = [{"role": "user", "content": "Give me a person."}]
    completion = client.chat.completions.parse(
        model="target", messages=messages, response_format=Person, max_tokens=200, temperature=0
    )
    assert isinstance(completion.choices[0].message.parsed, Person)
    assert completion.choices[0].finish_reason == "stop"


def test_sdk_chat_n2_json_schema_with_logprobs(default_server) -> None:
    """Sampled choices under one schema: each parses, and every token (forced ones included: no
    jump-forward with log-probabilities) has its entry, from a distribution that gave it mass."""
    client = openai.OpenAI(base_url=f"{default_server.url}/v1", api_key="unused")
    schema_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
    completion = client.chat.completions.create(
        model="target",
        messages=[{"role": "user", "content": "Give me a person."}],
        response_format=schema_format,
        n=2,
        temperature=0.7,
        seed=3,
        max_tokens=200,
        logprobs=True,
        top_logprobs=2,
    )
    assert [c.index for c in completion.choices] == [0, 1]
    for choice in completion.choices:
        assert choice.finish_reason == "stop"
        assert set(json.loads(choice.message.content)) == {"name", "age"}
        entries = choice.logprobs.content
        # the end token has its entry too (its text is not content)
        assert "".join(entry.token for entry in entries[:-1]) == choice.message.content
        assert all(-1e30 < entry.logprob <= 0.0 and len(entry.top_logprobs) == 2 for entry in entries)


def test_native_json_schema_is_the_same_with_and_without_speculation(default_server, target_only_server) -> None:
    """T = 0: the constrained speculative answer is byte-identical to the target-only one."""
    request = {"prompt": PROMPT, "json_schema": SCHEMA, "n_predict": 200, "temperature": 0}
    drafted = default_server.client().post("/completion", json=request).json()
    plain = target_only_server.client().post("/completion", json=request).json()
    assert drafted["content"] == plain["content"]
    assert set(json.loads(drafted["content"])) == {"name", "age"}


def test_gbnf_grammar_and_json_object(default_server) -> None:
    with default_server.client() as http:
        answer = http.post("/completion", json={"prompt": PROMPT, "grammar": 'root ::= "yes" | "no"', "n_predict": 8})
        assert answer.json()["content"] in {"yes", "no"}
        body = {"messages": [{"role": "user", "content": "JSON please"}], "max_tokens": 200, "temperature": 0}
        chat = http.post("/v1/chat/completions", json=body | {"response_format": {"type": "json_object"}}).json()
        if chat["choices"][0]["finish_reason"] == "stop":
            assert isinstance(json.loads(chat["choices"][0]["message"]["content"]), dict)
        else:  # cut by max_tokens: still a prefix of an object
            assert chat["choices"][0]["message"]["content"].startswith("{")


@pytest.mark.parametrize(
    ("route", "extra", "says"),
    [
        ("/completion", {"json_schema": {"type": "nope"}}, "invalid JSON schema"),
        ("/completion", {"grammar": "root ::= missing"}, "invalid grammar"),
        ("/completion", {"grammar": 'root ::= "a"', "json_schema": {"type": "object"}}, "at most one"),
        ("/completion", {"grammar": 'root ::= "a"', "ignore_eos": True}, "ignore_eos"),
        ("/v1/completions", {"response_format": {"type": "xml"}}, "response_format type"),
        ("/v1/completions", {"response_format": {"type": "json_schema"}}, "json_schema.schema"),
        ("/v1/chat/completions", {"tool_choice": "required"}, "no tools"),
        (
            "/v1/chat/completions",
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "name one",
        ),
        ("/v1/chat/completions", {"tools": TOOLS, "tool_choice": "required", "grammar": "root ::= [a]"}, "at most one"),
        ("/v1/chat/completions", {"tools": [{"type": "retrieval", "function": {"name": "r"}}]}, '"function"'),
    ],
)
def test_what_cannot_be_honoured_is_a_400(default_server, route: str, extra: dict, says: str) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}]} if "chat" in route else {"prompt": PROMPT}
    answer = default_server.client().post(route, json=body | {"max_tokens": 4} | extra)
    assert answer.status_code == 400
    assert says in answer.json()["error"]["message"]


@pytest.mark.parametrize(
    ("bounds", "key"),
    [({"minimum": 1.23e29, "maximum": 9.9e32}, "minimum"), ({"minimum": 1.23e29}, "minimum"),
     ({"maximum": 9.9e32}, "maximum"), ({"exclusiveMinimum": -9.9e32, "maximum": 0}, "exclusiveMinimum")],
)  # fmt: skip
def test_an_integer_bound_beyond_two_to_the_53_is_a_400_never_a_moved_answer(
    target_only_server, bounds: dict, key: str
) -> None:
    """llguidance saturated such bounds to int64: 1.23e29 <= a <= 9.9e32 answered 200 with
    {"a": 9223372036854775807}. Both routes' schemas reach the same check."""
    schema = {"type": "object", "properties": {"a": {"type": "integer", **bounds}}, "required": ["a"]}
    response_format = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    with target_only_server.client() as http:
        native = http.post("/completion", json={"prompt": PROMPT, "n_predict": 16, "json_schema": schema})
        chat_body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
        chat = http.post("/v1/chat/completions", json=chat_body | {"response_format": response_format})
    for answer in (native, chat):
        assert answer.status_code == 400, answer.text
        assert f"JSON schema: {key} " in answer.json()["error"]["message"]


@pytest.mark.parametrize(
    ("choice", "names"),
    [("required", {"get_weather", "get_time"}), ({"type": "function", "function": {"name": "get_time"}}, {"get_time"})],
)
def test_required_and_named_tool_choice_answer_tool_calls(default_server, choice, names: set[str]) -> None:
    client = openai.OpenAI(base_url=f"{default_server.url}/v1", api_key="unused")
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    completion = client.chat.completions.create(
        model="target", messages=messages, tools=TOOLS, tool_choice=choice, max_tokens=100, temperature=0, n=2
    )
    assert len(completion.choices) == 2  # each choice's row has its own matcher and its own call
    for choice_out in completion.choices:
        assert choice_out.finish_reason == "tool_calls" and choice_out.message.content is None
        (call,) = choice_out.message.tool_calls
        assert call.type == "function" and call.function.name in names
        arguments = json.loads(call.function.arguments)
        assert set(arguments) == ({"zone"} if call.function.name == "get_time" else {"city"})


def test_tool_choice_none_and_history_go_through_the_template(default_server) -> None:
    history = [
        {"role": "user", "content": "Time in UTC?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"zone": "UTC"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
    ]
    with default_server.client() as http:
        rendered = http.post("/apply-template", json={"messages": history}).json()["prompt"]
        assert "12:00" in rendered
        body = {"messages": history, "tools": TOOLS, "tool_choice": "none", "max_tokens": 8, "temperature": 0}
        message = http.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
        assert isinstance(message["content"], str) and "tool_calls" not in message


def test_auto_reports_a_call_only_when_the_whole_output_is_one() -> None:
    plan = tool_plan(msgspec.convert({"messages": [], "tools": TOOLS}, ChatRequest))
    assert not plan.forced
    (call,) = tool_calls(plan, '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>')
    assert call.function.name == "get_time" and json.loads(call.function.arguments) == {"zone": "UTC"}
    assert tool_calls(plan, 'It is {"name": "get_time", "arguments": {}}') is None
    assert tool_calls(plan, '{"name": "unknown", "arguments": {}}') is None
