"""What llama.cpp's own server tests ask of a server, on the shared (speculative) one: assistant
prefill (chat and Messages), `system_fingerprint` on OpenAI bodies, the `.../input_tokens` routes,
`add_generation_prompt`, and Anthropic's `messages: []`."""

from __future__ import annotations

import anthropic
import openai
import pytest

ASK = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
PREFILL = "def add_numbers(first, second):\n    "


def greedy_completion(server, prompt_text: str, n: int) -> str:
    """The target's greedy continuation of exactly this text (tokenized as the chat route does)."""
    with server.client() as http:
        tokens = http.post("/tokenize", json={"content": prompt_text}).json()["tokens"]
        return http.post("/completion", json={"prompt": tokens, "n_predict": n, "temperature": 0}).json()["content"]


def rendered(server, messages: list[dict]) -> str:
    return server.client().post("/apply-template", json={"messages": messages}).json()["prompt"]


def test_a_final_assistant_message_is_continued_on_the_chat_route(default_server) -> None:
    """As llama-server: the messages before it get the generation prompt, its text follows unclosed,
    and the answer is what comes after it (not a new turn)."""
    messages = [*ASK, {"role": "assistant", "content": PREFILL}]
    body = {"messages": messages, "max_tokens": 12, "temperature": 0}
    with default_server.client() as http:
        answer = http.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]
        new_turn = http.post("/v1/chat/completions", json=body | {"continue_final_message": False}).json()
    prompt = rendered(default_server, messages)
    assert prompt == rendered(default_server, ASK) + PREFILL  # /apply-template shows the same prompt
    assert answer == greedy_completion(default_server, prompt, 12)
    closed = new_turn["choices"][0]["message"]["content"]  # the message closed, and a new turn opened
    turn = f"{PREFILL}<|im_end|>\n<|im_start|>assistant\n"
    assert closed == greedy_completion(default_server, rendered(default_server, ASK) + turn, 12)


def test_continue_final_message_needs_an_assistant_message_last(default_server) -> None:
    body = {"messages": ASK, "max_tokens": 1, "continue_final_message": True}
    response = default_server.client().post("/v1/chat/completions", json=body)
    assert response.status_code == 400 and "continue_final_message" in response.json()["error"]["message"]


def test_a_final_assistant_message_is_continued_on_the_messages_route(default_server) -> None:
    sdk = anthropic.Anthropic(base_url=default_server.url, api_key="unused", max_retries=0)
    messages = [*ASK, {"role": "assistant", "content": PREFILL}]
    answer = sdk.messages.create(model="target", max_tokens=12, messages=messages, extra_body={"temperature": 0})
    assert answer.content[0].text == greedy_completion(default_server, rendered(default_server, messages), 12)


def test_add_generation_prompt_false_ends_after_the_last_message(default_server) -> None:
    body = {"messages": ASK, "max_tokens": 8, "temperature": 0, "add_generation_prompt": False}
    answer = default_server.client().post("/v1/chat/completions", json=body).json()
    assert answer["choices"][0]["message"]["content"] == greedy_completion(
        default_server, rendered(default_server, ASK).removesuffix("<|im_start|>assistant\n"), 8
    )


def test_messages_may_be_empty_as_llama_server_serves_them(default_server) -> None:
    body = {"model": "target", "max_tokens": 4, "system": "You write Python.", "messages": []}
    response = default_server.client().post("/v1/messages", json=body)
    assert response.status_code == 200, response.text
    counted = default_server.client().post("/v1/messages/count_tokens", json={"messages": []})
    assert counted.status_code == 200 and counted.json()["input_tokens"] > 0  # the generation prompt


def test_openai_bodies_carry_a_system_fingerprint(default_server) -> None:
    sdk = openai.OpenAI(base_url=f"{default_server.url}/v1", api_key="unused", max_retries=0)
    chat = sdk.chat.completions.create(model="target", messages=ASK, max_tokens=2)
    text = sdk.completions.create(model="target", prompt="def f():", max_tokens=2)
    chunks = list(sdk.chat.completions.create(model="target", messages=ASK, max_tokens=2, stream=True))
    assert chat.system_fingerprint and chat.system_fingerprint == text.system_fingerprint
    assert all(chunk.system_fingerprint == chat.system_fingerprint for chunk in chunks)


@pytest.mark.parametrize("path", ["/v1/chat/completions/input_tokens", "/chat/completions/input_tokens"])
def test_chat_input_tokens_count_the_rendered_prompt(default_server, path: str) -> None:
    with default_server.client() as http:
        counted = http.post(path, json={"model": "target", "messages": ASK}).json()
        tokens = http.post("/tokenize", json={"content": rendered(default_server, ASK)}).json()["tokens"]
    assert counted == {"object": "response.input_tokens", "input_tokens": len(tokens)}


@pytest.mark.parametrize("path", ["/v1/responses/input_tokens", "/responses/input_tokens"])
def test_responses_input_tokens_count_what_the_response_would_read(default_server, path: str) -> None:
    body = {"model": "target", "instructions": "Be brief.", "input": ASK[0]["content"]}
    with default_server.client() as http:
        counted = http.post(path, json=body).json()
        made = http.post("/v1/responses", json=body | {"max_output_tokens": 1}).json()
    assert counted["object"] == "response.input_tokens"
    assert counted["input_tokens"] == made["usage"]["input_tokens"]
