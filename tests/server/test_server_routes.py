"""Every completion route over real HTTP, streaming and not, with httpx and the openai client."""

from __future__ import annotations

import subprocess
import sys

import openai
import pytest

from tests.support.server import sse_frames

BASE_KEYS = [
    "cache_n",
    "prompt_n",
    "prompt_ms",
    "prompt_per_token_ms",
    "prompt_per_second",
    "predicted_n",
    "predicted_ms",
    "predicted_per_token_ms",
    "predicted_per_second",
]
DRAFT_KEYS = ["draft_n", "draft_n_accepted", "draft_rounds", "draft_kind"]
PROMPT = "def merge_sorted(left, right):\n"


def check_timings(timings: dict, drafted: bool) -> None:
    assert list(timings)[:9] == BASE_KEYS
    assert (list(timings)[9:] == DRAFT_KEYS) if drafted else (len(timings) == 9)
    n, ms = timings["predicted_n"], timings["predicted_ms"]
    if n > 1 and ms > 0:
        assert timings["predicted_per_second"] == pytest.approx(1000 * (n - 1) / ms, rel=1e-6)
        assert timings["predicted_per_token_ms"] == pytest.approx(ms / (n - 1), rel=1e-6)
    pn, pms = timings["prompt_n"], timings["prompt_ms"]
    assert timings["prompt_per_second"] == pytest.approx(1000 * pn / pms, rel=1e-6)
    assert timings["prompt_per_token_ms"] == pytest.approx(pms / pn, rel=1e-6)
    if drafted:
        assert 0 <= timings["draft_n_accepted"] <= min(n, timings["draft_n"])
        assert timings["draft_rounds"] >= 1 and timings["draft_kind"] == "draft-model"


def test_health_and_models(default_server) -> None:
    with default_server.client() as http:
        assert http.get("/health").json() == {"status": "ok"}
        assert http.get("/v1/health").json() == {"status": "ok"}
        for route in ("/v1/models", "/models"):
            assert http.get(route).json()["data"][0]["id"] == "target"


def test_native_completion_with_draft_block(default_server) -> None:
    with default_server.client() as http:
        for route in ("/completion", "/completions"):
            body = http.post(route, json={"prompt": PROMPT, "n_predict": 40, "temperature": 0}).json()
            assert body["stop"] is True and body["stop_type"] == "limit"
            assert body["tokens_predicted"] == body["timings"]["predicted_n"] == 40
            check_timings(body["timings"], drafted=True)


def test_target_only_has_no_draft_block_and_n_max_zero_opts_out(default_server, target_only_server) -> None:
    with target_only_server.client() as http:
        body = http.post("/completion", json={"prompt": PROMPT, "n_predict": 20, "temperature": 0}).json()
        check_timings(body["timings"], drafted=False)
    with default_server.client() as http:
        request = {"prompt": PROMPT, "n_predict": 20, "temperature": 0, "speculative.n_max": 0}
        check_timings(http.post("/completion", json=request).json()["timings"], drafted=False)


def test_native_stream_ends_with_the_full_object(default_server) -> None:
    request = {"prompt": PROMPT, "n_predict": 30, "temperature": 0, "stream": True, "timings_per_token": True}
    with default_server.client() as http, http.stream("POST", "/completion", json=request) as response:
        frames = sse_frames(response)
    assert "[DONE]" not in frames
    *partial, final = frames
    assert all(not f["stop"] for f in partial)
    # as llama-server's: the base keys, and the draft block so far once the row drafted; a round's
    # accepted drafts count up token by token, so each frame tells whether its token was one
    assert all(set(f["timings"]) in ({*BASE_KEYS}, {*BASE_KEYS, *DRAFT_KEYS}) for f in partial)
    accepted = [f["timings"].get("draft_n_accepted", 0) for f in partial]
    steps = [later - earlier for earlier, later in zip([0, *accepted], accepted, strict=False)]
    assert set(steps) <= {0, 1} and accepted[-1] == final["timings"]["draft_n_accepted"] > 0
    assert [f["timings"]["predicted_n"] for f in partial] == list(range(1, len(partial) + 1))
    assert final["stop"] is True and final["content"] == ""
    check_timings(final["timings"], drafted=True)
    streamed = "".join(f["content"] for f in partial)
    whole = default_server.client().post("/completion", json={**request, "stream": False}).json()
    assert streamed == whole["content"]


def test_chat_timings_only_on_the_finish_chunk(default_server) -> None:
    request = {
        "messages": [{"role": "user", "content": "Write a Python function `add`: Add numbers."}],
        "max_tokens": 24,
        "temperature": 0,
        "stream": True,
    }
    for route in ("/v1/chat/completions", "/chat/completions"):
        with default_server.client() as http, http.stream("POST", route, json=request) as response:
            frames = sse_frames(response)
        assert frames[-1] == "[DONE]"
        chunks = frames[:-1]
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant" and "timings" not in chunks[0]
        finish = [c for c in chunks if c["choices"][0]["finish_reason"]]
        assert len(finish) == 1 and finish[0] is chunks[-1]
        assert all("timings" not in c for c in chunks[:-1])
        check_timings(finish[0]["timings"], drafted=True)
    body = default_server.client().post("/v1/chat/completions", json={**request, "stream": False}).json()
    check_timings(body["timings"], drafted=True)
    assert body["choices"][0]["message"]["content"]


def test_openai_client_every_route(default_server) -> None:
    client = openai.OpenAI(base_url=f"{default_server.url}/v1", api_key="unused")
    assert client.models.list().data[0].id == "target"
    text = client.completions.create(model="target", prompt=PROMPT, max_tokens=16, temperature=0)
    assert text.choices[0].text and text.usage.completion_tokens == 16
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(model="target", prompt=PROMPT, max_tokens=16, temperature=0, stream=True)
    )
    assert streamed == text.choices[0].text
    messages = [{"role": "user", "content": "Write a Python function `add`: Add numbers."}]
    chat = client.chat.completions.create(model="target", messages=messages, max_tokens=16, temperature=0)
    assert chat.choices[0].message.content
    pieces = client.chat.completions.create(
        model="target", messages=messages, max_tokens=16, temperature=0, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in pieces) == chat.choices[0].message.content


def test_tokenize_roundtrip(default_server) -> None:
    with default_server.client() as http:
        tokens = http.post("/tokenize", json={"content": PROMPT}).json()["tokens"]
        assert http.post("/detokenize", json={"tokens": tokens}).json()["content"] == PROMPT
        pieces = http.post("/tokenize", json={"content": PROMPT, "with_pieces": True}).json()["tokens"]
        assert "".join(p["piece"] for p in pieces) == PROMPT
        body = http.post("/completion", json={"prompt": tokens, "n_predict": 8, "temperature": 0}).json()
        assert body["tokens_evaluated"] == len(tokens)


def test_temperature_zero_over_http_is_byte_identical_to_generate(default_server) -> None:
    cli = subprocess.run(
        [sys.executable, "-m", "app", "generate", "-p", PROMPT, "-n", "48", "--temp", "0", "--no-chat-template"],
        capture_output=True,
        text=True,
        check=True,
    )
    body = default_server.client().post("/completion", json={"prompt": PROMPT, "n_predict": 48, "temperature": 0})
    assert cli.stdout == body.json()["content"] + "\n"


@pytest.mark.parametrize(
    ("route", "payload", "fragment"),
    [
        ("/completion", b"{not json", "malformed"),
        ("/completion", {"prompt": "x", "n_predict": "many"}, "n_predict"),
        ("/completion", {"prompt": "x", "n_predict": -2}, "n_predict must be -1"),
        ("/completion", {"prompt": [5, 99999]}, "out of the vocabulary"),
        ("/completion", {"n_predict": 4}, "prompt"),
        ("/completion", {"prompt": "x", "top_p": 3}, "top_p"),
        ("/detokenize", {"tokens": [-1]}, "out of the vocabulary"),
        ("/v1/chat/completions", {"messages": []}, "messages"),
        ("/v1/chat/completions", {"messages": "hi"}, "messages"),
        ("/v1/completions", {"prompt": "x", "n": 99}, "server.max_rows"),
        ("/completion", {"prompt": "x", "speculative.n_max": -1}, "n_max"),
    ],
)
def test_bad_input_gets_400_in_the_envelope_and_the_server_keeps_serving(default_server, route, payload, fragment):
    with default_server.client() as http:
        kwargs = {"content": payload} if isinstance(payload, bytes) else {"json": payload}
        response = http.post(route, **kwargs)
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["code"] == 400 and error["type"] == "invalid_request_error"
        assert fragment.lower() in error["message"].lower()
        assert http.post("/completion", json={"prompt": "x", "n_predict": 2}).status_code == 200


def test_unknown_routes_and_methods(default_server) -> None:
    with default_server.client() as http:
        missing = http.get("/nowhere")
        assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
        assert http.get("/completion").status_code == 405
        assert http.get("/completion").json()["error"]["code"] == 405
