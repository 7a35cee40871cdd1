"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) with the real `anthropic` SDK.

The default profile speculates (a draft model), so every answer here ran through verify rounds;
at temperature 0 its text must be the chat route's for the same conversation, byte for byte.
"""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest

from app.server.core.shaping import RULE_HEADER
from tests.server.test_responses_api import TWO_CALLS
from tests.support.server import API_KEY

GREEDY = {"temperature": 0}  # the SDK has no temperature argument any more: it rides in extra_body
TOOLS = [
    {
        "name": "get_weather",
        "description": "Weather in a city",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}},
            "required": ["city"],
            "additionalProperties": False,
        },
    }
]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def client(server, key: str = "unused") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=key, max_retries=0)


def chat_text(server, messages: list[dict], max_tokens: int) -> str:
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0}
    reply = server.client().post("/v1/chat/completions", json=body).json()
    return reply["choices"][0]["message"]["content"]


def test_messages_create_and_stream_match_the_chat_route(default_server) -> None:
    sdk = client(default_server)
    messages = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Write a function"}, {"type": "text", "text": " to add."}],
        }
    ]
    made = sdk.messages.with_raw_response.create(
        model="target", max_tokens=24, system="You write Python.", messages=messages, extra_body=GREEDY
    )
    assert made.headers[RULE_HEADER] == "greedy-argmax"
    answer = made.parse()
    assert answer.type == "message" and answer.role == "assistant" and answer.id.startswith("msg_")
    assert answer.stop_reason == "max_tokens" and answer.usage.output_tokens == 24
    timings = answer.model_extra["timings"]
    assert timings["draft_kind"] == "draft-model" and timings["draft_rounds"] >= 1
    chat = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "Write a function to add."}]
    assert answer.content[0].text == chat_text(default_server, chat, 24)
    assert answer.usage.input_tokens + answer.usage.cache_read_input_tokens == timings["prompt_n"] + timings["cache_n"]

    with sdk.messages.stream(
        model="target", max_tokens=24, system="You write Python.", messages=messages, extra_body=GREEDY
    ) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) > 1 and "".join(pieces) == answer.content[0].text
    assert final.content[0].text == answer.content[0].text and final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == 24


def test_the_raw_event_stream_is_anthropics(default_server) -> None:
    body = {"model": "target", "max_tokens": 8, "messages": ASK, "stream": True, "temperature": 0}
    with default_server.client() as http, http.stream("POST", "/v1/messages", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    names = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    payloads = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: ")]
    assert [p["type"] for p in payloads] == names
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    assert payloads[0]["message"]["usage"]["output_tokens"] == 0
    assert payloads[-2]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert payloads[-2]["usage"]["output_tokens"] == 8 and "draft_n" in payloads[-2]["timings"]


def test_stop_sequences_end_the_answer_and_are_named(default_server) -> None:
    sdk = client(default_server)
    whole = sdk.messages.create(model="target", max_tokens=30, messages=ASK, extra_body=GREEDY).content[0].text
    word = whole[6:9]  # a piece the greedy answer reaches
    assert len(word) == 3 and word not in whole[:8]
    cut = sdk.messages.create(model="target", max_tokens=30, messages=ASK, stop_sequences=[word], extra_body=GREEDY)
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == word
    assert cut.content[0].text == whole[:6]


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_tool_answers_a_tool_use_block_and_its_result_continues(default_server, stream: bool) -> None:
    sdk = client(default_server)
    request = {"model": "target", "max_tokens": 60, "messages": ASK, "tools": TOOLS, "extra_body": GREEDY}
    if stream:
        with sdk.messages.stream(**request, tool_choice={"type": "tool", "name": "get_weather"}) as events:
            answer = events.get_final_message()
    else:
        answer = sdk.messages.create(**request, tool_choice={"type": "any"})
    assert answer.stop_reason == "tool_use"
    (call,) = answer.content
    assert call.type == "tool_use" and call.name == "get_weather" and call.id.startswith("toolu_")
    assert set(call.input) == {"city"} and isinstance(call.input["city"], str)
    history = [
        *ASK,
        {"role": "assistant", "content": [{"type": "tool_use", "id": call.id, "name": call.name, "input": call.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 21 C"}]},
    ]
    follow = sdk.messages.create(model="target", max_tokens=12, messages=history, tools=TOOLS,
                                 tool_choice={"type": "none"}, extra_body=GREEDY)  # fmt: skip
    assert follow.content[0].type == "text" and follow.stop_reason in ("max_tokens", "end_turn")


def test_output_config_format_follows_the_schema(default_server) -> None:
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    answer = client(default_server).messages.create(
        model="target",
        max_tokens=40,
        messages=ASK,
        output_config={"format": {"type": "json_schema", "schema": schema}},
        extra_body=GREEDY,
    )
    assert set(json.loads(answer.content[0].text)) == {"ok"}


def test_count_tokens_is_the_rendered_prompt(default_server) -> None:
    sdk = client(default_server)
    counted = sdk.messages.count_tokens(model="target", system="Be brief.", messages=ASK).input_tokens
    rendered = (
        default_server.client()
        .post("/apply-template", json={"messages": [{"role": "system", "content": "Be brief."}, *ASK]})
        .json()["prompt"]
    )
    tokens = default_server.client().post("/tokenize", json={"content": rendered}).json()["tokens"]
    assert counted == len(tokens)


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"messages": [{"role": "system", "content": "x"}]}, '"user" or "assistant"'),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "text-only"),
        ({"messages": ASK, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "server tools"),
        ({"messages": ASK, "tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
        ({"messages": ASK, "output_config": {"format": {"type": "regex"}}}, "output_config.format"),
    ],
)
def test_what_cannot_be_honoured_is_a_clear_400(default_server, body: dict, needle: str) -> None:
    with pytest.raises(anthropic.BadRequestError) as refused:
        client(default_server).messages.create(model="target", max_tokens=4, **body)
    assert needle in refused.value.response.json()["error"]["message"]


@pytest.mark.slow
def test_x_api_key_is_the_key(keyed_server) -> None:
    assert client(keyed_server, API_KEY).messages.create(model="target", max_tokens=2, messages=ASK).content
    with pytest.raises(anthropic.AuthenticationError):
        client(keyed_server, "wrong").messages.create(model="target", max_tokens=2, messages=ASK)
    bare = httpx.post(f"{keyed_server.url}/v1/messages/count_tokens", json={"messages": ASK}, timeout=30)
    assert bare.status_code == 401


def test_langchain_chat_anthropic_answers(default_server) -> None:
    chat_anthropic = pytest.importorskip("langchain_anthropic").ChatAnthropic  # dev extra; skips where absent
    model = chat_anthropic(model="target", base_url=default_server.url, api_key="unused", max_tokens=16,
                           temperature=0, max_retries=0)  # fmt: skip
    reply = model.invoke([("system", "You write Python."), ("human", "Write a function")])
    want = chat_text(default_server, [{"role": "system", "content": "You write Python."},
                                      {"role": "user", "content": "Write a function"}], 16)  # fmt: skip
    assert reply.content == want and reply.response_metadata["stop_reason"] == "max_tokens"
    streamed = "".join(chunk.content for chunk in model.stream("Write a function") if isinstance(chunk.content, str))
    assert streamed == chat_text(default_server, [{"role": "user", "content": "Write a function"}], 16)


def test_two_calls_are_two_tool_use_blocks_unless_parallel_use_is_disabled(default_server) -> None:
    tools = [{"name": n, "input_schema": {"type": "object"}} for n in "fg"]
    fields = {"model": "target", "max_tokens": 40, "messages": [{"role": "user", "content": "call both"}],
              "tools": tools, "extra_body": {"temperature": 0, "output_config": {
                  "format": {"type": "json_schema", "schema": TWO_CALLS}}}}  # fmt: skip
    sdk = client(default_server)
    both = sdk.messages.create(**fields)
    assert [(block.type, block.name) for block in both.content] == [("tool_use", "f"), ("tool_use", "g")]
    assert both.stop_reason == "tool_use"
    one = sdk.messages.create(**fields, tool_choice={"type": "auto", "disable_parallel_tool_use": True})
    assert [block.name for block in one.content] == ["f"]
