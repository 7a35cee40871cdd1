"""OpenAI's Responses API (/v1/responses) with the real OpenAI SDK, on the speculative default profile.

At temperature 0 an answer must be the chat route's for the same conversation, byte for byte:
the Responses route is the chat pipeline (template, tools, grammar, speculation) behind another shape.
"""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

from app.server.core.shaping import RULE_HEADER
from app.server.responses.store import ResponseStore

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}
JSON_FORMAT = {"format": {"type": "json_schema", "name": "verdict", "schema": SCHEMA, "strict": True}}
TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}},
            "required": ["city"],
            "additionalProperties": False,
        },
    }
]


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def chat_text(server, messages: list[dict], max_tokens: int) -> str:
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0}
    return server.client().post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]


def test_create_is_the_chat_answer_with_usage_timings_and_the_rule(default_server) -> None:
    raw = client(default_server).responses.with_raw_response.create(
        model="target", instructions="You write Python.", input="Write a function", max_output_tokens=20, temperature=0
    )
    assert raw.headers[RULE_HEADER] == "greedy-argmax"
    answer = raw.parse()
    assert answer.object == "response" and answer.id.startswith("resp_")
    assert answer.status == "incomplete" and answer.incomplete_details.reason == "max_output_tokens"
    assert answer.usage.output_tokens == 20 and answer.usage.total_tokens == answer.usage.input_tokens + 20
    assert answer.instructions == "You write Python." and answer.temperature == 0
    chat = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "Write a function"}]
    assert answer.output_text == chat_text(default_server, chat, 20)
    timings = answer.model_extra["timings"]
    assert timings["draft_kind"] == "draft-model" and timings["draft_rounds"] >= 1
    unversioned = {"instructions": "You write Python.", "input": "Write a function", "max_output_tokens": 20,
                   "temperature": 0}  # fmt: skip
    aliased = default_server.client().post("/responses", json=unversioned).json()  # llama-server's spelling
    assert aliased["output"][0]["content"][0]["text"] == answer.output_text


def test_a_stream_is_the_sdks_event_sequence_and_the_same_text(default_server) -> None:
    sdk = client(default_server)
    request = {"model": "target", "input": "Write a function", "max_output_tokens": 16, "temperature": 0}
    whole = sdk.responses.create(**request).output_text
    events = list(sdk.responses.create(**request, stream=True))
    kinds = [event.type for event in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]  # fmt: skip
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]  # fmt: skip
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
    assert len(deltas) > 1 and "".join(deltas) == whole == events[-1].response.output_text
    assert events[-1].response.usage.output_tokens == 16


def test_responses_stream_with_a_json_schema_completes_parsed(default_server) -> None:
    with client(default_server).responses.stream(
        model="target", input="Is water wet?", max_output_tokens=40, temperature=0, text=JSON_FORMAT
    ) as stream:
        texts = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.status == "completed" and set(json.loads(final.output_text)) == {"ok"}
    assert "".join(texts) == final.output_text


def test_previous_response_id_continues_the_stored_conversation(default_server) -> None:
    sdk = client(default_server)
    first = sdk.responses.create(model="target", input="Write a function", max_output_tokens=12, temperature=0)
    second = sdk.responses.create(
        model="target", input="Another one", previous_response_id=first.id, max_output_tokens=12, temperature=0
    )
    assert second.previous_response_id == first.id
    history = [
        {"role": "user", "content": "Write a function"},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "Another one"},
    ]
    assert second.output_text == chat_text(default_server, history, 12)
    unstored = sdk.responses.create(model="target", input="x", max_output_tokens=2, store=False)
    assert unstored.store is False
    for missing in (unstored.id, "resp_unknown"):
        with pytest.raises(openai.BadRequestError, match="not found"):
            sdk.responses.create(model="target", input="y", previous_response_id=missing, max_output_tokens=2)


@pytest.mark.parametrize("stream", [False, True])
def test_function_tools_answer_a_call_and_its_output_continues(default_server, stream: bool) -> None:
    sdk = client(default_server)
    request = {"model": "target", "input": "Weather in Paris?", "tools": TOOLS, "max_output_tokens": 60,
               "temperature": 0}  # fmt: skip
    if stream:
        with sdk.responses.stream(**request, tool_choice={"type": "function", "name": "get_weather"}) as events:
            answer = events.get_final_response()
    else:
        answer = sdk.responses.create(**request, tool_choice="required")
    (call,) = answer.output
    assert call.type == "function_call" and call.name == "get_weather" and set(json.loads(call.arguments)) == {"city"}
    follow = sdk.responses.create(
        model="target",
        input=[
            {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
            {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"},
        ],
        tools=TOOLS,
        tool_choice="none",
        max_output_tokens=8,
        temperature=0,
    )
    assert follow.output[0].type == "message" and follow.output_text


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"background": True}, "background"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "text parts"),
        ({"tools": [{"type": "web_search"}]}, "function tools"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "needs a schema"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "not supported"),
    ],
)
def test_what_cannot_be_honoured_is_a_clear_400(default_server, body: dict, needle: str) -> None:
    with pytest.raises(openai.BadRequestError, match=needle):
        client(default_server).responses.create(**{"model": "target", "input": "hi", "max_output_tokens": 2, **body})


def test_the_store_is_bounded_by_count_and_bytes_and_kept_per_tenant() -> None:
    store = ResponseStore(entries=2, max_bytes=200)
    for n in range(3):
        store.keep("a", f"resp_{n}", [{"role": "user", "content": str(n)}])
    assert store.history("a", "resp_2") == [{"role": "user", "content": "2"}]
    with pytest.raises(Exception, match="not found"):
        store.history("a", "resp_0")  # the oldest went first
    with pytest.raises(Exception, match="not found"):
        store.history("b", "resp_2")  # another tenant's
    for n in range(3):
        store.keep("b", f"resp_b{n}", [{"role": "user", "content": "x" * 60}])  # about 90 bytes each
    assert store.history("a", "resp_1") and store.history("a", "resp_2")  # b's traffic evicts none of a's
    with pytest.raises(Exception, match="not found"):
        store.history("b", "resp_b0")  # two of b's fill its 200 bytes: the oldest went
    store.keep("b", "resp_huge", [{"role": "user", "content": "x" * 300}])  # larger than a tenant's bytes
    with pytest.raises(Exception, match="not found"):
        store.history("b", "resp_huge")
    assert store.history("b", "resp_b2")


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["prompt-lookup", "mtp"])
def test_other_speculative_profiles_answer_as_their_chat_route(profile_server, profile: str) -> None:
    server = profile_server(profile)
    chat = [{"role": "user", "content": "def fibonacci(n):"}]
    want = chat_text(server, chat, 24)
    answer = client(server).responses.with_raw_response.create(
        model="target", input="def fibonacci(n):", max_output_tokens=24, temperature=0
    )
    assert answer.parse().output_text == want and answer.headers[RULE_HEADER] != "none"
    messages = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0).messages.create(
        model="target", max_tokens=24, messages=chat, extra_body={"temperature": 0}
    )
    assert messages.content[0].text == want and messages.model_extra["timings"]["draft_rounds"] >= 1


TWO_CALLS = {  # an output of exactly two calls, f's then g's
    "type": "array",
    "prefixItems": [
        {"type": "object", "properties": {"name": {"const": n}, "arguments": {"type": "object", "maxProperties": 0}},
         "required": ["name", "arguments"], "additionalProperties": False}
        for n in "fg"
    ],
    "items": False,
    "minItems": 2,
}  # fmt: skip


def test_parallel_calls_are_several_items_unless_parallel_tool_calls_is_false(default_server) -> None:
    """OpenAI's default parallel_tool_calls is true: an answer of two calls is two function_call items."""
    tools = [{"type": "function", "name": n, "parameters": {"type": "object"}} for n in "fg"]
    body = {"model": "target", "input": "call both", "max_output_tokens": 40, "temperature": 0, "tools": tools,
            "text": {"format": {"type": "json_schema", "name": "calls", "schema": TWO_CALLS}}}  # fmt: skip
    sdk = client(default_server)
    both = sdk.responses.create(**body)
    assert [(item.type, item.name) for item in both.output] == [("function_call", "f"), ("function_call", "g")]
    assert len({item.call_id for item in both.output}) == 2
    (first,) = sdk.responses.create(**body, parallel_tool_calls=False).output
    assert (first.type, first.name) == ("function_call", "f")
    events = list(sdk.responses.create(**body, stream=True))
    done = [(e.item.name, e.output_index) for e in events if e.type == "response.output_item.done"]
    assert done == [("f", 0), ("g", 1)]
