"""Fields llama-server or OpenAI define and this server does not honour (app/server/field_policy.py):
a value that asks for something answers 400 naming the field; a neutral one is served; a field
neither API defines is ignored, as llama-server ignores it. One request per case, on the shared server.
"""

from __future__ import annotations

import msgspec
import pytest

from app.server.chat.request import ChatRequest
from app.server.chat.template import template_kwargs
from app.server.core import field_policy
from tests.support import ROOT

NATIVE = ("/completion", {"prompt": "def f():"})
COMPLETIONS = ("/v1/completions", {"prompt": "def f():"})
CHAT = ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})
ROUTE = (
    dict.fromkeys(field_policy.LLAMA_SERVER, NATIVE)
    | dict.fromkeys(field_policy.NATIVE, NATIVE)
    | dict.fromkeys(field_policy.CHAT, CHAT)
    | dict.fromkeys(field_policy.OPENAI_COMPLETION, COMPLETIONS)
)
# field: (a value asking for something, a neutral value)
CASES = {
    "adaptive_target": (0.5, -1.0),
    "min_keep": (5, 0),
    "n_keep": (16, 0),
    "n_discard": (8, 0),
    "n_cmpl": (2, 1),
    "n_cache_reuse": (256, 0),
    "image_data": ([{"data": "aGk=", "id": 1}], []),
    "lora": ([{"id": 0, "scale": 1.0}], []),
    "reasoning_budget_tokens": (64, -1),
    "thinking_forced_open": (True, False),
    "chat_format": (3, 0),
    "chat_parser": ("peg", ""),
    "speculative.type": ("ngram-simple", None),
    "speculative.ngram_size_n": (4, None),
    "speculative.ngram_size_m": (8, None),
    "speculative.ngram_m_hits": (2, None),
    "n": (2, 1),
    "functions": ([{"name": "f", "parameters": {"type": "object"}}], None),
    "function_call": ({"name": "f"}, "none"),
    "audio": ({"voice": "alloy", "format": "wav"}, None),
    "modalities": (["text", "audio"], ["text"]),
    "prediction": ({"type": "content", "content": "x"}, None),
    "web_search_options": ({}, None),
    "verbosity": ("low", None),
    "service_tier": ("flex", "auto"),
    "store": (True, False),
    "best_of": (3, 1),
}


def post(server, field: str, value: object):
    path, body = ROUTE[field]
    return server.client().post(path, json=body | {"max_tokens": 1, field: value})


def test_every_listed_field_has_a_case_and_a_row_in_the_docs() -> None:
    assert set(CASES) == set(field_policy.EVERY_FIELD)
    docs = (ROOT / "docs" / "server.md").read_text()
    refused = docs.split("400 unless neutral")[1].split("Structured outputs and tools")[0]
    assert [field for field in CASES if f"`{field}`" not in refused] == []


@pytest.mark.parametrize("field", sorted(CASES))
def test_a_value_asking_for_something_answers_400_naming_the_field(default_server, field: str) -> None:
    response = post(default_server, field, CASES[field][0])
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith(f"{field}: not supported: ")


@pytest.mark.parametrize("field", sorted(CASES))
def test_a_neutral_value_is_served(default_server, field: str) -> None:
    response = post(default_server, field, CASES[field][1])
    assert response.status_code == 200, response.text


def test_llama_server_fields_are_refused_on_the_openai_routes_too(default_server) -> None:
    """llama-server reads its own fields from OpenAI bodies as well (its oaicompat parsers copy them)."""
    for path, body in (CHAT, COMPLETIONS):
        response = default_server.client().post(path, json=body | {"max_tokens": 1, "n_keep": 16})
        assert response.status_code == 400 and response.json()["error"]["message"].startswith("n_keep: ")


def test_best_of_equal_to_n_is_served(default_server) -> None:
    """OpenAI's best_of = n generates n choices and returns them all: what n alone does."""
    path, body = COMPLETIONS
    response = default_server.client().post(path, json=body | {"max_tokens": 1, "n": 2, "best_of": 2})
    assert response.status_code == 200 and len(response.json()["choices"]) == 2


def test_dry_breakers_are_bounded(default_server) -> None:
    """Each breaker is matched against the whole vocabulary: a request may name 16, as llama-server's
    defaults name 4; 17 answer 400 before any matching."""
    body = {"prompt": "def f():", "n_predict": 1, "dry_multiplier": 0.8}
    with default_server.client() as http:
        assert http.post("/completion", json=body | {"dry_sequence_breakers": ["x"] * 16}).status_code == 200
        refused = http.post("/completion", json=body | {"dry_sequence_breakers": [str(i) for i in range(17)]})
    assert refused.status_code == 400 and "dry_sequence_breakers: at most 16" in refused.json()["error"]["message"]


def test_a_number_switch_refuses_a_boolean(default_server) -> None:
    """`mirostat: false` is no spelling of 0: it answers 400 rather than guess."""
    response = default_server.client().post(
        "/completion", json={"prompt": "def f():", "n_predict": 1, "mirostat": False}
    )
    assert response.status_code == 400


@pytest.mark.parametrize(
    "settings",
    [
        {"dry_multiplier": 0.8, "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": -1,
         "dry_sequence_breakers": ["\n", ":", "\"", "*"]},
        {"dynatemp_range": 0.5, "dynatemp_exponent": 1},
        {"typical_p": 0.9},
        {"top_n_sigma": 1.5, "samplers": "edskypmxt"},
        {"mirostat": 2, "mirostat_tau": 5, "mirostat_eta": 0.1},
        {"mirostat": 1},
    ],
    ids=["dry", "dynatemp", "typical", "top_n_sigma", "mirostat2", "mirostat1"],
)  # fmt: skip
def test_the_web_uis_body_with_a_further_sampler_turned_on_is_served(default_server, settings: dict) -> None:
    """llama.cpp's web UI sends its settings panel's values: with DRY, dynamic temperature, typical,
    top-n-sigma or mirostat turned on, the stream is served (the stages run: tests/decoding/test_sampler_guards.py)."""
    body = {
        "messages": [{"role": "user", "content": "Hi"}], "stream": True, "return_progress": True,
        "reasoning_format": "auto", "backend_sampling": False, "max_tokens": 6, "timings_per_token": True,
        "temperature": 0.8, "dynatemp_range": 0, "dynatemp_exponent": 1, "top_k": 40, "top_p": 0.95,
        "min_p": 0.05, "typical_p": 1, "xtc_probability": 0, "xtc_threshold": 0.1, "repeat_last_n": 64,
        "repeat_penalty": 1, "presence_penalty": 0, "frequency_penalty": 0, "dry_multiplier": 0,
        "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": -1, "samplers": "edkypmxt", "seed": 7,
    } | settings  # fmt: skip
    with default_server.client() as http, http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200, response.read()
        frames = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    chunks = [msgspec.json.decode(frame) for frame in frames[:-1]]
    assert any(choice["delta"].get("content") for chunk in chunks for choice in chunk["choices"])  # text came


# llama.cpp's web UI's chat body with its default settings (it adds return_progress when it streams)
WEB_UI_DEFAULTS = {
    "messages": [{"role": "user", "content": "Hi"}], "reasoning_format": "auto", "backend_sampling": False,
    "max_tokens": 8, "timings_per_token": True, "temperature": 0.8, "dynatemp_range": 0, "top_k": 40,
    "top_p": 0.95, "min_p": 0.05, "typical_p": 1, "xtc_probability": 0, "xtc_threshold": 0.1,
    "repeat_last_n": 64, "repeat_penalty": 1, "presence_penalty": 0, "frequency_penalty": 0,
    "dry_multiplier": 0, "samplers": "edkypmxt", "seed": 7,
}  # fmt: skip


def test_the_llama_cpp_web_uis_default_body_is_served_streamed_and_not(default_server) -> None:
    """llama.cpp's web UI streams with return_progress and reasoning_format "auto" (and may send
    backend_sampling): a 400 there broke every message it sent. Unstreamed, the same body answers
    a chat.completion whose message is what the stream's chunks add up to (the seed fixes both)."""
    with default_server.client() as http:
        answer = http.post("/v1/chat/completions", json=WEB_UI_DEFAULTS)
        streamed = WEB_UI_DEFAULTS | {"stream": True, "return_progress": True}
        with http.stream("POST", "/v1/chat/completions", json=streamed) as response:
            assert response.status_code == 200, response.read()
            frames = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    chunks = [msgspec.json.decode(frame) for frame in frames[:-1]]
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["object"] == "chat.completion" and len(body["choices"]) == 1
    (choice,) = body["choices"]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"] == content != ""
    assert choice["finish_reason"] in ("stop", "length")
    assert body["usage"]["completion_tokens"] == body["timings"]["predicted_n"] > 0
    assert "prompt_progress" not in body  # progress frames are a stream's only


def test_reasoning_effort_reaches_the_chat_template(default_server) -> None:
    """OpenAI's reasoning_effort (Open WebUI sends it when set) is the template's variable of that
    name, as llama-server passes it; the embedded template does not read it, so the answer is served."""
    path, body = CHAT
    response = default_server.client().post(path, json=body | {"max_tokens": 1, "reasoning_effort": "high"})
    assert response.status_code == 200, response.text


def test_reasoning_effort_becomes_a_template_variable_unless_the_kwargs_name_it() -> None:
    messages = [{"role": "user", "content": "Hi"}]
    plain = msgspec.convert({"messages": messages, "reasoning_effort": "low"}, ChatRequest)
    assert template_kwargs(plain) == {"reasoning_effort": "low"}
    both = msgspec.convert(
        {"messages": messages, "reasoning_effort": "low", "chat_template_kwargs": {"reasoning_effort": "high"}},
        ChatRequest,
    )
    assert template_kwargs(both) == {"reasoning_effort": "high"}


def test_a_field_neither_api_defines_is_ignored(default_server) -> None:
    """As llama-server: an unknown field is neither honoured nor refused."""
    path, body = NATIVE
    response = default_server.client().post(path, json=body | {"n_predict": 1, "not_a_field": {"x": [1]}})
    assert response.status_code == 200, response.text
