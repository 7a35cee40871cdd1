"""Streamed tool calls: OpenAI's `delta.tool_calls` (id, type and name, then argument pieces),
several calls in one answer with `parallel_tool_calls`, and the text a stream holds back while
it may still become calls. Real server, real OpenAI SDK."""

from __future__ import annotations

import json

import msgspec
import openai

from app.server.chat.request import ChatRequest
from app.server.chat.tools import CallStream, tool_calls, tool_plan
from tests.server.test_structured_outputs import TOOLS

QUESTION = "What is the weather in Paris and the time in UTC?"
TWO_CALLS = (
    '[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {"zone": "UTC"}}]'
)
# Three worked examples of an answer with two calls, so the small model copies the shape
FEW_SHOT = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": TWO_CALLS}] * 3 + [
    {"role": "user", "content": QUESTION}
]


def _plan(**fields: object):
    return tool_plan(msgspec.convert({"messages": [], "tools": TOOLS} | fields, ChatRequest))


def _sdk(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")


def _reassembled(chunks) -> tuple[list[dict[str, str]], str | None, str]:
    """The calls as a client joins them (by `index`), the finish reason and the content."""
    calls: dict[int, dict[str, str]] = {}
    reason, content = None, ""
    for chunk in chunks:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            reason = choice.finish_reason or reason
            for piece in choice.delta.tool_calls or []:
                call = calls.setdefault(piece.index, {"id": "", "name": "", "arguments": ""})
                call["id"] += piece.id or ""
                call["name"] += piece.function.name or ""
                call["arguments"] += piece.function.arguments or ""
    return [calls[i] for i in sorted(calls)], reason, content


def test_several_calls_parse_from_an_array_or_tagged_blocks() -> None:
    plan = _plan()
    assert [c.function.name for c in tool_calls(plan, TWO_CALLS)] == ["get_weather", "get_time"]
    tagged = '<tool_call>{"name": "get_time", "arguments": {"zone": "UTC"}}</tool_call>\n' * 2
    assert [c.function.name for c in tool_calls(plan, tagged)] == ["get_time", "get_time"]
    assert tool_calls(plan, tagged + "and that is all") is None  # text outside the blocks: content
    assert tool_calls(plan, "[]") is None and tool_calls(plan, '[{"name": "get_time"}]') is None


def test_parallel_tool_calls_makes_the_forced_schema_an_array() -> None:
    assert "anyOf" in _plan(tool_choice="required").schema()  # llama-server's default: one call object
    schema = _plan(tool_choice="required", parallel_tool_calls=True).schema()
    assert schema["type"] == "array" and schema["minItems"] == 1 and "anyOf" in schema["items"]


def test_a_call_stream_holds_text_only_while_it_may_become_calls() -> None:
    auto = CallStream(_plan())
    assert auto.feed(" <tool", []) == ("", [])  # a tag's start: held
    assert auto.feed('_call>{"name": "get_time", ', []) == ("", [])
    auto.feed('"arguments": {"zone": "UTC"}}</tool_call>', [])
    (call,) = auto.calls()
    assert call.function.name == "get_time"

    prose = CallStream(_plan())
    assert prose.feed(" <b>", []) == (" <b>", [])  # can no longer be a call: everything goes out
    assert prose.feed("def f():", []) == ("def f():", [])
    assert prose.calls() is None and prose.release() == ("", [])

    unfinished = CallStream(_plan())
    unfinished.feed('{"name": "get_time"', [])
    assert unfinished.calls() is None and unfinished.release() == ('{"name": "get_time"', [])


def test_sdk_streams_a_required_call_as_id_name_then_argument_pieces(default_server) -> None:
    client = _sdk(default_server)
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    fields = {"model": "target", "messages": messages, "tools": TOOLS, "max_tokens": 100, "temperature": 0}
    whole = client.chat.completions.create(**fields, tool_choice="required").choices[0]
    chunks = list(client.chat.completions.create(**fields, tool_choice="required", stream=True))
    pieces = [p for c in chunks for ch in c.choices for p in ch.delta.tool_calls or []]
    first, *rest = pieces
    assert first.id.startswith("call_") and first.type == "function" and first.function.arguments == ""
    assert rest and all(p.id is None and p.function.name is None for p in rest)
    (call,), reason, content = _reassembled(chunks)
    assert reason == "tool_calls" and content == ""
    assert (call["name"], call["arguments"]) == (
        whole.message.tool_calls[0].function.name,
        whole.message.tool_calls[0].function.arguments,
    )


def test_sdk_streams_two_parallel_calls_and_reassembles_them(default_server) -> None:
    """Sampled with a seed, a choice replays: the first seed whose answer is two or more calls is
    streamed too, through the SDK's stream helper, and must reassemble into the same calls."""
    client = _sdk(default_server)
    fields = {
        "model": "target",
        "messages": FEW_SHOT,
        "tools": TOOLS,
        "tool_choice": "required",
        "parallel_tool_calls": True,
        "max_tokens": 120,
        "temperature": 1.0,
    }
    for seed in range(16):
        whole = client.chat.completions.create(**fields, seed=seed).choices[0]
        if len(whole.message.tool_calls) >= 2:
            break
    else:
        raise AssertionError("no seed of 16 gave two calls")
    expected = [(c.function.name, json.loads(c.function.arguments)) for c in whole.message.tool_calls]
    with client.chat.completions.stream(**fields, seed=seed) as stream:
        final = stream.get_final_completion().choices[0]
    assert final.finish_reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in final.message.tool_calls] == expected
    assert len({c.id for c in final.message.tool_calls}) == len(expected)


def test_auto_streams_prose_as_content_unchanged(default_server) -> None:
    """A choice that is not a call is streamed as content: the same text as unstreamed."""
    client = _sdk(default_server)
    fields = {"model": "target", "messages": FEW_SHOT, "tools": TOOLS, "max_tokens": 60, "temperature": 0}
    whole = client.chat.completions.create(**fields).choices[0]
    assert whole.message.tool_calls is None  # the model writes code here, not a call
    calls, reason, content = _reassembled(client.chat.completions.create(**fields, stream=True))
    assert calls == [] and reason == whole.finish_reason and content == whole.message.content


def test_include_usage_sends_a_last_chunk_with_empty_choices(default_server) -> None:
    client = _sdk(default_server)
    messages = [{"role": "user", "content": "Hi"}]
    fields = {"model": "target", "messages": messages, "max_tokens": 8, "temperature": 0, "stream": True}
    chunks = list(client.chat.completions.create(**fields, stream_options={"include_usage": True}))
    *body, last = chunks
    assert last.choices == [] and last.usage.completion_tokens > 0
    assert last.model_extra["timings"]["predicted_n"] == last.usage.completion_tokens
    assert all(chunk.usage is None for chunk in body)
    without = list(client.chat.completions.create(**fields))
    assert without[-1].choices and without[-1].usage.total_tokens == last.usage.total_tokens
    text = list(
        client.completions.create(
            model="target", prompt="def", max_tokens=4, stream=True, stream_options={"include_usage": True}
        )
    )
    assert text[-1].choices == [] and text[-1].usage.completion_tokens == 4


def test_langchain_streams_a_tool_call_and_reassembles_it(default_server) -> None:
    """LangChain's ChatOpenAI with bound tools: `.stream()` yields message chunks whose
    tool-call pieces add up (by LangChain's own chunk merging) to the call the unstreamed answer makes."""
    from langchain_openai import ChatOpenAI

    question = "What is the weather in Paris?"
    whole = _sdk(default_server).chat.completions.create(
        model="target",
        messages=[{"role": "user", "content": question}],
        tools=TOOLS,
        tool_choice="required",
        max_tokens=100,
        temperature=0,
    )
    (expected,) = whole.choices[0].message.tool_calls
    chat = ChatOpenAI(
        base_url=f"{default_server.url}/v1", api_key="unused", model="target", temperature=0, max_tokens=100
    )
    chunks = list(chat.bind_tools(TOOLS, tool_choice="required").stream(question))
    assert sum(bool(chunk.tool_call_chunks) for chunk in chunks) > 1  # streamed in pieces, not whole
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged += chunk
    (call,) = merged.tool_calls
    assert call["name"] == expected.function.name
    assert call["args"] == json.loads(expected.function.arguments)
    assert call["id"].startswith("call_")
    assert merged.response_metadata["finish_reason"] == "tool_calls"
