"""The chat template and a request's tools: the embedded pair's template renders them (so
count_tokens counts them and /props says so), and a template that drops them is named in /props'
`chat_template_caps` and at startup, since the model then never sees the tools and `auto` never
answers a call. Whether the model calls the tools it is shown is the load-time probe's finding
(app/engine/tool_probe.py): false for the embedded target, which answers in code, true for a tiny
model trained to call, and in each case what a client's `auto` request then gets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.engine import tool_probe
from app.loading import EMBEDDED_TARGET
from app.loading.chat_template import ENVIRONMENT, Limits, capabilities, render
from tests.support.server import serve
from tests.support.tool_caller import build_tool_caller

# the embedded pair's template before it rendered tools: plain ChatML
PLAIN_CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' "
    "+ '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
WEATHER = {
    "name": "get_weather",
    "description": "The current weather of a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_count_tokens_counts_the_tools(default_server) -> None:
    with default_server.client() as http:
        bare = http.post("/v1/messages/count_tokens", json={"messages": ASK}).json()["input_tokens"]
        tooled = http.post("/v1/messages/count_tokens", json={"messages": ASK, "tools": [WEATHER]}).json()
    assert tooled["input_tokens"] > bare + 20  # the tool's signature is in the prompt


def test_the_embedded_template_renders_tools_and_props_says_so(default_server) -> None:
    caps = default_server.client().get("/props").json()["chat_template_caps"]
    assert caps == {
        "supports_system_role": True,
        "supports_tools": True,
        "supports_tool_calls": True,
        "supports_parallel_tool_calls": True,
    }
    (started,) = default_server.events("acceptance_rule_active")
    assert started["template_renders_tools"] is True
    assert default_server.events("chat_template_ignores_tools") == []


def probe_request(tool_choice: str = "auto") -> dict:
    """The probe's own request, as a client sends it."""
    return {"messages": tool_probe.MESSAGES, "tools": [tool_probe.TOOL], "tool_choice": tool_choice, "max_tokens": 64}


def test_props_and_startup_say_the_embedded_target_answers_tools_in_text(default_server) -> None:
    assert default_server.client().get("/props").json()["model_calls_tools"] is False
    (started,) = default_server.events("acceptance_rule_active")
    assert started["model_calls_tools"] is False
    (warning,) = default_server.events("model_ignores_tools")
    assert warning["probe"] == "get_weather"
    with default_server.client() as http:  # what /props says is what a client's `auto` gets
        message = http.post("/v1/chat/completions", json=probe_request()).json()["choices"][0]["message"]
        # greedy: an unseeded draw at the default temperature ran the call past 64 tokens 1 time in 3
        forced = http.post("/v1/chat/completions", json=probe_request("required") | {"temperature": 0}).json()
        forced = forced["choices"][0]
    assert message.get("tool_calls") is None and message["content"]
    assert forced["finish_reason"] == "tool_calls"  # a forced call is decoded against the schema all the same
    assert forced["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


@pytest.mark.slow
def test_a_model_that_calls_tools_is_found_calling_and_auto_reports_its_call(tmp_path: Path) -> None:
    model = build_tool_caller(tmp_path / "caller")
    with serve(tmp_path, "-m", str(model)) as server, server.client() as http:
        props = http.get("/props").json()
        choice = http.post("/v1/chat/completions", json=probe_request()).json()["choices"][0]
    assert props["model_calls_tools"] is True
    (started,) = server.events("acceptance_rule_active")
    assert started["model_calls_tools"] is True
    assert server.events("model_ignores_tools") == []
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}


def test_tool_free_prompts_render_as_plain_chatml_did() -> None:
    """The tool-aware template changes no prompt without tools (the recorded hashes stay)."""
    limits = Limits(2.0, 1 << 20)
    plain = ENVIRONMENT.from_string(PLAIN_CHATML)
    shipped = ENVIRONMENT.from_string((EMBEDDED_TARGET / "chat_template.jinja").read_text())
    conversations = [
        ASK,
        [{"role": "system", "content": "Be brief."}, *ASK, {"role": "assistant", "content": "Sunny."}],
        [{"role": "user", "content": "a\nb"}, {"role": "assistant", "content": ""}],
    ]
    for messages in conversations:
        for generation_prompt in (True, False):
            variables = {"messages": messages, "add_generation_prompt": generation_prompt, "tools": None}
            assert render(plain, limits, variables) == render(shipped, limits, variables)
    assert not capabilities(plain, limits, {}).supports_tools


@pytest.mark.slow
def test_a_template_that_drops_tools_is_named_in_props_and_at_startup(tmp_path: Path) -> None:
    (tmp_path / "plain.jinja").write_text(PLAIN_CHATML)
    args = ("-m", str(EMBEDDED_TARGET), "--chat-template-file", str(tmp_path / "plain.jinja"))
    with serve(tmp_path, *args) as server, server.client() as http:
        props = http.get("/props").json()
        caps = props["chat_template_caps"]
        bare = http.post("/v1/messages/count_tokens", json={"messages": ASK}).json()["input_tokens"]
        tooled = http.post("/v1/messages/count_tokens", json={"messages": ASK, "tools": [WEATHER]}).json()
    assert caps["supports_tools"] is False and caps["supports_tool_calls"] is False
    assert props["chat_template"] == PLAIN_CHATML  # the template in use, not the model's own
    assert tooled["input_tokens"] == bare  # the template drops them: what the model sees is counted
    (started,) = server.events("acceptance_rule_active")
    assert started["template_renders_tools"] is False
    assert started["model_calls_tools"] is None  # the model is not probed with tools it never sees
    (warning,) = server.events("chat_template_ignores_tools")
    assert warning["template"] == str(tmp_path / "plain.jinja")
