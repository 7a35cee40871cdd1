"""Thinking blocks as llama-server's reasoning_format parses them: a chat template with thinking
tags (the embedded target's ChatML plus a `<think>` block opened by `enable_thinking`), and a
grammar that makes the small model close the block, so the answer has both parts."""

from __future__ import annotations

import re
from pathlib import Path

import openai
import pytest

from app.server.chat.reasoning import Reasoning, ThinkingStream, split
from tests.support.cli import write
from tests.support.server import serve

TEMPLATE = """{%- for m in messages -%}<|im_start|>{{ m.role }}
{% if m.reasoning_content %}<think>
{{ m.reasoning_content }}
</think>

{% endif %}{{ m.content }}<|im_end|>
{% endfor -%}
{%- if add_generation_prompt -%}<|im_start|>assistant
{% if enable_thinking %}<think>
{% endif %}{%- endif -%}"""
THOUGHT_THEN_ANSWER = 'root ::= [a-z]{3,8} "</think>" [a-z]{2,6}'
MESSAGES = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def thinking_server(tmp_path_factory: pytest.TempPathFactory):
    tmp: Path = tmp_path_factory.mktemp("thinking")
    (tmp / "think.jinja").write_text(TEMPLATE)
    profile = write(tmp, "think", f'target = "@TARGET@"\n[server]\nchat_template_file = "{tmp / "think.jinja"}"\n')
    with serve(tmp, "--profile", str(profile)) as running:
        yield running


def test_a_thinking_block_splits_whole_and_streamed_alike() -> None:
    assert split(Reasoning(opened=False), "<think>\nplan</think>\n\nHello") == ("plan", "Hello")
    assert split(Reasoning(opened=False), "Hello <think>") == (None, "Hello <think>")  # not at the start
    assert split(Reasoning(opened=True), "still thinking") == ("still thinking", "")  # never closed
    stream = ThinkingStream(Reasoning(opened=False))
    pieces = [stream.feed(piece) for piece in (" <thi", "nk>\nab</th", "ink>\n\nxy")]
    assert pieces == [("", ""), ("ab", ""), ("", "xy")] and stream.finish() == ("", "")


@pytest.mark.slow
def test_thinking_goes_to_reasoning_content_and_streams_as_its_delta(thinking_server) -> None:
    client = openai.OpenAI(base_url=f"{thinking_server.url}/v1", api_key="unused")
    fields = {
        "model": "target",
        "messages": MESSAGES,
        "max_tokens": 40,
        "temperature": 0,
        "extra_body": {"grammar": THOUGHT_THEN_ANSWER, "chat_template_kwargs": {"enable_thinking": True}},
    }
    message = client.chat.completions.create(**fields).choices[0].message
    thought = message.model_extra["reasoning_content"]
    assert re.fullmatch("[a-z]{3,8}", thought) and re.fullmatch("[a-z]{2,6}", message.content)
    chunks = list(client.chat.completions.create(**fields, stream=True))
    deltas = [choice.delta for chunk in chunks for choice in chunk.choices]
    streamed = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    assert streamed == thought and "".join(d.content or "" for d in deltas) == message.content


@pytest.mark.slow
def test_reasoning_format_none_and_templates_without_an_open_block_leave_the_text(thinking_server) -> None:
    with thinking_server.client() as http:
        body = {"messages": MESSAGES, "max_tokens": 40, "temperature": 0, "grammar": THOUGHT_THEN_ANSWER}
        thinking = {"chat_template_kwargs": {"enable_thinking": True}}
        raw = http.post("/v1/chat/completions", json=body | thinking | {"reasoning_format": "none"}).json()
        message = raw["choices"][0]["message"]
        assert "</think>" in message["content"] and "reasoning_content" not in message
        plain = {**body, "grammar": "root ::= [a-z]{3,8}", "chat_template_kwargs": {"enable_thinking": False}}
        message = http.post("/v1/chat/completions", json=plain).json()["choices"][0]["message"]
        assert "reasoning_content" not in message and re.fullmatch("[a-z]{3,8}", message["content"])
        bad = http.post("/v1/chat/completions", json=body | {"reasoning_format": "sideways"})
        assert bad.status_code == 400 and "reasoning_format" in bad.json()["error"]["message"]


@pytest.mark.slow
def test_past_reasoning_reaches_the_template(thinking_server) -> None:
    """(enable_thinking reaching it is what opens the block in the test above.)"""
    history = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello", "reasoning_content": "be brief"},
        {"role": "user", "content": "Again"},
    ]
    with thinking_server.client() as http:
        prompt = http.post("/apply-template", json={"messages": history}).json()["prompt"]
    assert "<think>\nbe brief\n</think>\n\nHello" in prompt and prompt.endswith("assistant\n")
