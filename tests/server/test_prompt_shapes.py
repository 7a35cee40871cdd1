"""Prompt shapes and multiplicity over real HTTP: llama-server's prompt forms on /completion, and
OpenAI's list of prompts, `n` and `echo` through the OpenAI SDK (issue 14, item 4)."""

from __future__ import annotations

from collections import defaultdict

import httpx
import openai
import pytest

from app.sampling.rng import resolve_seed
from tests.support.server import sse_frames

A, B = "def add(a, b):\n", "class Stack:\n"
SHORT = {"n_predict": 8, "temperature": 0}
SAMPLED = {"temperature": 0.7, "seed": 1234}
MESSAGES = [{"role": "user", "content": "Write a Python function `add`: Add numbers."}]


def complete(http, prompt, **fields) -> dict:
    response = http.post("/completion", json={"prompt": prompt, **SHORT, **fields})
    assert response.status_code == 200, response.text
    return response.json()


def test_a_list_of_prompts_answers_one_result_per_prompt(default_server) -> None:
    with default_server.client() as http:
        alone = [complete(http, p)["content"] for p in (A, B)]
        both = complete(http, [A, B])
        assert isinstance(both, list) and [r["index"] for r in both] == [0, 1]
        assert [r["content"] for r in both] == alone
        assert [r["prompt"] for r in both] == [A, B]

        with http.stream("POST", "/completion", json={"prompt": [A, B], **SHORT, "stream": True}) as response:
            frames = sse_frames(response)
    text, last = defaultdict(str), {}
    for f in frames:
        text[f["index"]] += f["content"]
        if f["stop"]:
            last[f["index"]] = f
    assert [text[0], text[1]] == alone and sorted(last) == [0, 1]
    assert all(f["stop_type"] == "limit" for f in last.values())


def test_every_llama_server_prompt_form(default_server) -> None:
    with default_server.client() as http:
        head = http.post("/tokenize", json={"content": "def add(a", "add_special": True}).json()["tokens"]
        tail = http.post("/tokenize", json={"content": "):\n"}).json()["tokens"]
        ids = [11, 293]  # "," " b" need not be what the text would tokenize to: ids go in as given
        mixed = complete(http, ["def add(a", *ids, "):\n"])
        concatenated = complete(http, head + ids + tail)
        assert mixed["tokens_evaluated"] == len(head + ids + tail)
        assert mixed["content"] == concatenated["content"]

        text = complete(http, A)["content"]
        assert complete(http, {"prompt_string": A})["content"] == text
        assert complete(http, {"prompt_string": A})["prompt"] == A
        many = complete(http, [{"prompt_string": A}, head + ids + tail, ["def add(a", *ids, "):\n"]])
        assert [r["content"] for r in many] == [text, concatenated["content"], concatenated["content"]]


@pytest.mark.parametrize(
    ("route", "payload", "fragment"),
    [
        ("/completion", {"prompt": {"prompt_string": A, "multimodal_data": ["aGk="]}}, "multimodal"),
        ("/completion", {"prompt": [{"prompt_string": A, "multimodal_data": []}]}, "multimodal"),
        ("/completion", {"prompt": [["def", "add"]]}, "each element"),
        ("/completion", {"prompt": []}, "must not be empty"),
        ("/completion", {"prompt": [A] * 9}, "server.max_rows"),
        ("/v1/completions", {"prompt": [A, B], "n": 5}, "server.max_rows"),
        ("/v1/completions", {"prompt": A, "n": 0}, "n must be >= 1"),
        ("/v1/chat/completions", {"messages": MESSAGES, "n": 9}, "server.max_rows"),
    ],
)
def test_prompt_shapes_that_answer_400(default_server, route, payload, fragment) -> None:
    response = default_server.client().post(route, json=payload)
    assert response.status_code == 400
    assert fragment in response.json()["error"]["message"]


def test_openai_sdk_prompts_times_n_seeded_per_choice(default_server) -> None:
    client = openai.OpenAI(base_url=f"{default_server.url}/v1", api_key="unused")
    both = client.completions.create(model="target", prompt=[A, B], n=2, max_tokens=8, **SAMPLED)
    assert [c.index for c in both.choices] == [0, 1, 2, 3]
    # choice j of a prompt runs with seed + j: each replays alone
    for index, choice in enumerate(both.choices):
        prompt, j = (A, B)[index // 2], index % 2
        alone = client.completions.create(
            model="target", prompt=prompt, max_tokens=8, temperature=0.7, seed=SAMPLED["seed"] + j
        )
        assert choice.text == alone.choices[0].text
    prompt_tokens = sum(
        client.completions.create(model="target", prompt=p, max_tokens=1).usage.prompt_tokens for p in (A, B)
    )
    assert both.usage.prompt_tokens == prompt_tokens  # a prompt counts once, as OpenAI bills
    assert both.usage.completion_tokens == 4 * 8

    chunks = list(client.completions.create(model="target", prompt=[A, B], n=2, max_tokens=8, stream=True, **SAMPLED))
    streamed = defaultdict(str)
    for chunk in chunks:
        streamed[chunk.choices[0].index] += chunk.choices[0].text
    assert [streamed[i] for i in range(4)] == [c.text for c in both.choices]
    assert [counts(c.usage) for c in chunks if c.usage] == [counts(both.usage)]  # once, on the last finish chunk


def counts(usage) -> tuple[int, int, int]:
    """A usage's token counts; its cached tokens follow what earlier requests left in the prompt cache."""
    return usage.prompt_tokens, usage.completion_tokens, usage.total_tokens


def test_openai_sdk_chat_n(default_server) -> None:
    client = openai.OpenAI(base_url=f"{default_server.url}/v1", api_key="unused")
    chat = client.chat.completions.create(model="target", messages=MESSAGES, n=2, max_tokens=12, **SAMPLED)
    assert [c.index for c in chat.choices] == [0, 1]
    second = client.chat.completions.create(
        model="target", messages=MESSAGES, max_tokens=12, temperature=0.7, seed=SAMPLED["seed"] + 1
    )
    assert chat.choices[1].message.content == second.choices[0].message.content
    assert chat.usage.prompt_tokens == second.usage.prompt_tokens  # the conversation counts once
    assert chat.usage.completion_tokens <= 2 * 12

    chunks = list(
        client.chat.completions.create(model="target", messages=MESSAGES, n=2, max_tokens=12, stream=True, **SAMPLED)
    )
    roles = [c.choices[0].index for c in chunks if c.choices and c.choices[0].delta.role == "assistant"]
    assert roles == [0, 1]
    text = defaultdict(str)
    for chunk in chunks:
        text[chunk.choices[0].index] += chunk.choices[0].delta.content or ""
    assert [text[0], text[1]] == [c.message.content for c in chat.choices]
    assert [counts(c.usage) for c in chunks if c.usage] == [counts(chat.usage)]


def test_echo_puts_the_prompt_before_the_text(default_server) -> None:
    client = openai.OpenAI(base_url=f"{default_server.url}/v1", api_key="unused")
    uncached = {"cache_prompt": False}  # both prefill the whole prompt: the same usage in any order
    plain = client.completions.create(model="target", prompt=A, max_tokens=8, temperature=0, extra_body=uncached)
    echoed = client.completions.create(
        model="target", prompt=A, max_tokens=8, temperature=0, echo=True, extra_body=uncached
    )
    assert echoed.choices[0].text == A + plain.choices[0].text
    assert echoed.usage == plain.usage
    stream = client.completions.create(model="target", prompt=A, max_tokens=8, temperature=0, echo=True, stream=True)
    assert "".join(c.choices[0].text for c in stream) == echoed.choices[0].text


def test_a_client_that_leaves_stops_every_row(default_server) -> None:
    long = {"n_predict": 3000, "ignore_eos": True, "temperature": 0}
    with default_server.client() as http:
        with http.stream("POST", "/completion", json={"prompt": [A, B, A], **long, "stream": True}) as response:
            rid = response.headers["x-request-id"]
            next(line for line in response.iter_lines() if line.startswith("data: "))
        for row in (rid, f"{rid}-1", f"{rid}-2"):  # row i > 0 logs as <x-request-id>-<i>
            assert default_server.wait_for_event("request_cancelled", row)["decided"] < 3000
        with pytest.raises(httpx.ReadTimeout):
            http.post("/v1/chat/completions", json={"messages": MESSAGES, "n": 3, **long}, timeout=2)
        default_server.wait_idle()


def test_choice_seeds_wrap_like_seeds() -> None:
    assert [resolve_seed(7, j) for j in range(3)] == [7, 8, 9]
    assert resolve_seed(2**64 - 1, 1) == 0 and resolve_seed(-2, 1) == 2**64 - 1
    assert 0 <= resolve_seed(-1, 5) < 2**32  # unseeded: each choice draws its own
