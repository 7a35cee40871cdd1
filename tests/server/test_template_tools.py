"""The chat template and a request's tools: the embedded pair's template renders them (so
count_tokens counts them and /props says so), and a template that drops them is named in /props'
`chat_template_caps` and at startup, since the model then never sees the tools and `auto` never
answers a call."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.loading import EMBEDDED_TARGET
from app.loading.chat_template import ENVIRONMENT, Limits, capabilities, render
from tests.support.server import serve

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
        caps = http.get("/props").json()["chat_template_caps"]
        bare = http.post("/v1/messages/count_tokens", json={"messages": ASK}).json()["input_tokens"]
        tooled = http.post("/v1/messages/count_tokens", json={"messages": ASK, "tools": [WEATHER]}).json()
    assert caps["supports_tools"] is False and caps["supports_tool_calls"] is False
    assert tooled["input_tokens"] == bare  # the template drops them: what the model sees is counted
    (started,) = server.events("acceptance_rule_active")
    assert started["template_renders_tools"] is False
    (warning,) = server.events("chat_template_ignores_tools")
    assert warning["template"] == str(tmp_path / "plain.jinja")
