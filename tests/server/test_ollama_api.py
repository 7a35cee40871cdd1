"""Ollama's API on the shared default server, through Ollama's own Python client and LiteLLM's
`ollama_chat/` provider: the listings, chat and generate (NDJSON lines and whole bodies), options
as the sampler's fields, `format` through the grammar engine, the durations from the row's
timings, and every error as Ollama's `{"error": "..."}`."""

from __future__ import annotations

import json
import os

import httpx
import ollama
import pytest

from tests.server.test_structured_outputs import TOOLS

ASK = [{"role": "user", "content": "Write a function"}]
GREEDY = {"num_predict": 8, "temperature": 0}


def client(server) -> ollama.Client:
    return ollama.Client(host=server.url)


def test_the_listings_name_the_served_model(default_server) -> None:
    ollama_client = client(default_server)
    (listed,) = ollama_client.list().models
    assert listed.model == "target" and listed.details.family == "qwen3" and listed.size > 0
    assert listed.details.format == "safetensors" and listed.digest
    (running,) = ollama_client.ps().models
    assert running.model == "target" and running.context_length > 0
    shown = ollama_client.show("target:latest")  # Ollama's default tag reads as the served model
    assert "completion" in shown.capabilities and "tools" in shown.capabilities  # the template renders tools
    assert shown.modelinfo["general.architecture"] == "qwen3"
    assert shown.template == default_server.client().get("/props").json()["chat_template"]
    assert httpx.get(f"{default_server.url}/api/version").json()["version"]


def test_a_chat_answers_as_the_openai_route_does_with_ollamas_durations(default_server) -> None:
    """Any model name is served (as the OpenAI routes serve it); at T = 0 the text is the chat
    route's, streamed or not, and the durations are the row's timings in nanoseconds (the client
    keeps Ollama's keys: `timings` is read off the wire)."""
    ollama_client = client(default_server)
    whole = ollama_client.chat(model="llama3.2", messages=ASK, options=GREEDY)
    with default_server.client() as http:
        openai = http.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 8, "temperature": 0}).json()
        wire = http.post("/api/chat", json={"model": "llama3.2", "messages": ASK, "options": GREEDY,
                                            "stream": False}).json()  # fmt: skip
        with http.stream("POST", "/api/chat", json={"messages": ASK, "options": GREEDY}) as response:
            assert response.headers["content-type"] == "application/x-ndjson"
            last = json.loads(list(response.iter_lines())[-1])
    assert whole.message.content == openai["choices"][0]["message"]["content"] == wire["message"]["content"]
    assert (whole.done, whole.done_reason, whole.eval_count, whole.model) == (True, "length", 8, "target")
    timings = wire["timings"]
    assert wire["eval_duration"] == round(timings["predicted_ms"] * 1e6)
    assert wire["prompt_eval_duration"] == round(timings["prompt_ms"] * 1e6)
    assert wire["prompt_eval_count"] == openai["usage"]["prompt_tokens"] and wire["eval_count"] == 8
    assert wire["total_duration"] >= wire["eval_duration"] + wire["prompt_eval_duration"]
    assert timings["draft_kind"] == "draft-model" and wire["speculative_biased"] is False
    assert last["done"] and last["timings"]["predicted_n"] == 8 and last["eval_count"] == 8
    lines = list(ollama_client.chat(model="llama3.2", messages=ASK, options=GREEDY, stream=True))
    *pieces, end = lines
    assert all(not line.done for line in pieces) and end.done and end.done_reason == "length"
    assert "".join(line.message.content for line in lines) == whole.message.content


def test_generate_through_the_template_raw_and_with_context(default_server) -> None:
    ollama_client = client(default_server)
    templated = ollama_client.generate(model="m", prompt=ASK[0]["content"], options=GREEDY)
    chat = ollama_client.chat(model="m", messages=ASK, options=GREEDY)
    assert templated.response == chat.message.content  # the prompt as the user's turn, as Ollama applies it
    raw = ollama_client.generate(model="m", prompt="def fib(n):", raw=True, options=GREEDY)
    native = default_server.client().post("/completion", json={"prompt": "def fib(n):", "n_predict": 8,
                                                               "temperature": 0})  # fmt: skip
    assert raw.response == native.json()["content"]
    assert len(raw.context) == raw.prompt_eval_count + raw.eval_count  # the prompt's and the answer's tokens
    lines = list(ollama_client.generate(model="m", prompt="def fib(n):", raw=True, options=GREEDY, stream=True))
    assert "".join(line.response for line in lines) == raw.response and lines[-1].context == raw.context
    following = ollama_client.generate(model="m", prompt="\n", raw=True, context=raw.context, options=GREEDY)
    assert following.prompt_eval_count > len(raw.context)


def test_options_reach_the_sampler(default_server) -> None:
    ollama_client = client(default_server)
    seeded = {"num_predict": 12, "temperature": 1.0, "top_k": 20, "top_p": 0.9, "min_p": 0.05, "seed": 7}
    first = ollama_client.chat(model="m", messages=ASK, options=seeded).message.content
    assert ollama_client.chat(model="m", messages=ASK, options=seeded).message.content == first
    body = {"messages": ASK, "max_tokens": 12, "temperature": 1.0, "top_k": 20, "top_p": 0.9, "min_p": 0.05,
            "seed": 7}  # fmt: skip
    openai = default_server.client().post("/v1/chat/completions", json=body).json()
    assert openai["choices"][0]["message"]["content"] == first  # the same seed, the same sampler: the same tokens
    plain = ollama_client.chat(model="m", messages=ASK, options=GREEDY).message.content
    stopped = ollama_client.chat(model="m", messages=ASK, options=GREEDY | {"stop": [plain[3:6]]})
    assert stopped.message.content == plain[:3] and stopped.done_reason == "stop"


def test_num_ctx_is_the_rows_context_and_a_no_op_when_it_holds_the_answer(default_server) -> None:
    ollama_client = client(default_server)
    plain = ollama_client.chat(model="m", messages=ASK, options=GREEDY)
    roomy = ollama_client.chat(model="m", messages=ASK, options=GREEDY | {"num_ctx": 4096})
    assert roomy.message.content == plain.message.content
    tight = plain.prompt_eval_count + 3
    cut = ollama_client.chat(model="m", messages=ASK, options=GREEDY | {"num_ctx": tight})
    assert (cut.eval_count, cut.done_reason) == (3, "length") and plain.message.content.startswith(cut.message.content)
    with pytest.raises(ollama.ResponseError) as refused:
        ollama_client.chat(model="m", messages=ASK, options={"num_ctx": 4})
    assert refused.value.status_code == 400 and "num_ctx" in refused.value.error


def test_format_json_and_a_schema_go_through_the_grammar(default_server) -> None:
    ollama_client = client(default_server)
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}}, "required": ["name"],
              "additionalProperties": False}  # fmt: skip
    answer = ollama_client.generate(model="m", prompt="Describe a person", format=schema, options={"num_predict": 40})
    assert list(json.loads(answer.response)) == ["name"]
    loose = ollama_client.chat(model="m", messages=ASK, format="json", options={"num_predict": 30, "seed": 3})
    assert isinstance(json.loads(loose.message.content), dict)


def test_tools_keep_alive_think_and_loading(default_server) -> None:
    """Tools reach the template (the embedded target answers them in text); keep_alive and think are
    accepted; a request with nothing to say is Ollama's load (or, keep_alive 0, unload) answer."""
    ollama_client = client(default_server)
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    answer = ollama_client.chat(model="m", messages=ask, tools=TOOLS, keep_alive="5m", think=False, options=GREEDY)
    assert answer.message.content and answer.done
    call = {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    history = [
        *ask,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
    ]
    assert ollama_client.chat(model="m", messages=history, tools=TOOLS, options=GREEDY).done
    assert ollama_client.generate(model="m", prompt="").done_reason == "load"
    assert ollama_client.chat(model="m", messages=[], keep_alive=0).done_reason == "unload"


def test_log_probabilities_in_ollamas_shape(default_server) -> None:
    answer = client(default_server).chat(model="m", messages=ASK, options=GREEDY, logprobs=True, top_logprobs=2)
    assert len(answer.logprobs) == 8
    assert all(len(entry.top_logprobs) == 2 and entry.logprob <= 0 for entry in answer.logprobs)


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"),
    [
        ("/api/show", {"model": "llama3.2"}, 404, "model 'llama3.2' not found"),
        ("/api/show", {}, 400, "model is required"),
        ("/api/chat", {"messages": ASK, "options": {"temperature": "hot"}}, 400, "options.temperature"),
        ("/api/chat", {"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, 400, "images"),
        ("/api/generate", {"prompt": "x", "images": ["aGk="]}, 400, "images"),
        ("/api/generate", {"prompt": "x", "template": "{{ .Prompt }}"}, 400, "template"),
        ("/api/generate", {"prompt": "x", "suffix": "y"}, 400, "Infill is not supported by this model"),
        ("/api/chat", {"messages": ASK, "format": "yaml"}, 400, "format"),
        ("/api/chat", {"messages": ASK, "think": "maximal"}, 400, "think"),
        ("/api/embed", {"input": "hi"}, 404, "embeddings are off"),
        ("/api/pull", {"model": "llama3.2"}, 501, "chosen by the profile"),
    ],
)
def test_errors_are_ollamas_shape(default_server, path: str, body: dict, status: int, needle: str) -> None:
    response = default_server.client().post(path, json=body)
    assert response.status_code == status and list(response.json()) == ["error"]
    assert needle in response.json()["error"]


def test_an_unknown_model_name_is_named_not_copied(default_server) -> None:
    """A 404 for a model name of any length (a body may carry megabytes) quotes its first 100
    characters and says how long it was, on Ollama's and OpenAI's model routes alike."""
    name = "m" * 20_000
    with default_server.client() as http:
        shown = http.post("/api/show", json={"model": name})
        retrieved = http.get(f"/v1/models/{name}")
    for answer in (shown, retrieved):
        assert answer.status_code == 404, answer.text
        assert len(answer.text) < 600 and "(20000 characters)" in answer.text


def test_malformed_json_is_an_ollama_error(default_server) -> None:
    response = default_server.client().post("/api/chat", content=b"{not json")
    assert response.status_code == 400 and list(response.json()) == ["error"]


def test_litellm_ollama_chat_provider(default_server) -> None:
    """LiteLLM's `ollama_chat/` provider, as an app configures it: its own bodies, unchanged."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of its price list
    import litellm

    fields = {"model": "ollama_chat/llama3.2", "api_base": default_server.url, "messages": ASK, "temperature": 0}
    whole = litellm.completion(**fields, max_tokens=8)
    expected = client(default_server).chat(model="m", messages=ASK, options=GREEDY)
    assert whole.choices[0].message.content == expected.message.content
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 8
    chunks = list(litellm.completion(**fields, max_tokens=8, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected.message.content
    shaped = litellm.completion(**fields, max_tokens=30, response_format={"type": "json_object"})
    assert isinstance(json.loads(shaped.choices[0].message.content), dict)
