"""Issue 24's bounded responses: what one request may make the server build.

The audit's request (/completion with 8 prompts, n_probs 1000, n_predict 300) built a 200 MB
answer, grew the server by a gigabyte and held the event loop for 21 s. It is refused up front
now; a row whose length is not known up front stops with a 400 once it reaches its share of
server.max_logprob_entries; a non-streamed body over server.max_response_bytes is a 400; large
bodies are built off the event loop; and no log line carries a whole field.
"""

from __future__ import annotations

import io
import json
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import msgspec
import pytest
import structlog

from app.profiles.schema import Settings
from app.runtime.bounds import RequestBoundError
from app.runtime.logging import EXCEPTION_CAP, FIELD_CAP, configure_logging
from app.server.chat.request import ChatRequest
from app.server.core.bodies import encoded
from app.server.core.requests import probs_request
from app.server.errors import ApiError
from app.server.native.requests import CompletionRequest
from tests.support.server import RunningServer, serve, sse_frames

AMPLIFICATION = {"prompt": ["def f(x):"] * 8, "n_probs": 1000, "n_predict": 300}
SMALL_BUDGET = 500  # log-probability entries per request on this module's own server (some 40 kB of JSON)
SMALL_BODY = 50_000  # bytes of a non-streamed body on this module's own server
UNTIL_EOS = {"prompt": "def f(x):", "temperature": 0, "ignore_eos": True, "n_probs": 99}  # 100 entries a token
HEALTH_S = 1.0  # the /health canary's slowest answer while a hostile request runs


# --- the arithmetic, in process ---------------------------------------------------------------


def test_openai_top_logprobs_20_at_the_default_max_tokens_fit_the_default_budget() -> None:
    settings = Settings()
    chat = msgspec.convert(
        {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 20}, ChatRequest
    )
    probs = probs_request(chat, settings)
    assert probs is not None and probs.max_entries == settings.server.max_logprob_entries
    explicit = msgspec.convert(
        {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 20, "max_tokens": 4096},
        ChatRequest,
    )
    assert probs_request(explicit, settings) is not None  # the longest a row runs, refused neither up front
    probs.check_room(settings.server.max_tokens)  # nor at run time


def test_the_audits_request_is_refused_up_front_naming_the_key() -> None:
    with pytest.raises(ApiError) as refused:
        probs_request(msgspec.convert(AMPLIFICATION, CompletionRequest), Settings(), rows=8)
    assert refused.value.code == 400
    assert "8 row(s) x 300 tokens x 1001 entries make 2402400" in refused.value.message
    assert "server.max_logprob_entries" in refused.value.message


def test_each_row_gets_an_even_share_and_stops_past_it() -> None:
    probs = probs_request(msgspec.convert(UNTIL_EOS, CompletionRequest), Settings(), rows=4)
    assert probs is not None and probs.max_entries == Settings().server.max_logprob_entries // 4
    probs.check_room(probs.max_entries // 100)
    with pytest.raises(RequestBoundError, match=r"server\.max_logprob_entries"):
        probs.check_room(probs.max_entries // 100 + 1)


def test_every_logged_field_is_capped_in_both_chains() -> None:
    """structlog's own events and the standard library's records (uvicorn, Litestar) alike."""
    stream = io.StringIO()
    configure_logging("info", stream=stream)
    try:
        structlog.get_logger("t").info("big", grammar="g" * 100_000, nested={"rows": ["r" * 50_000]})
        logging.getLogger("library").warning("w" * 100_000)
        try:
            raise ValueError("v" * 100_000)
        except ValueError:
            structlog.get_logger("t").exception("failed")
    finally:
        configure_logging(None)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3
    big, library, failed = map(json.loads, lines)
    assert big["grammar"] == "g" * FIELD_CAP + "...[95904 characters cut]"
    assert big["nested"]["rows"][0].endswith("...[45904 characters cut]")
    assert library["event"] == "w" * FIELD_CAP + "...[95904 characters cut]"
    assert failed["exception"].endswith("characters cut]") and len(failed["exception"]) < EXCEPTION_CAP + 64
    assert all(len(line) < EXCEPTION_CAP + 1024 for line in lines)


def test_an_encoded_body_over_the_limit_is_refused() -> None:
    with pytest.raises(ApiError, match=r"server\.max_response_bytes"):
        encoded(lambda: {"text": "t" * 2048}, 1024)
    assert encoded(lambda: {"text": "t"}, 1024) == b'{"text":"t"}'


# --- real servers -------------------------------------------------------------------------------


@contextmanager
def health_canary(url: str) -> Iterator[list[float]]:
    """/health's answer times, sampled every 50 ms while the block runs (and one after)."""
    seconds: list[float] = []
    done = threading.Event()

    def probe() -> None:
        with httpx.Client(base_url=url, timeout=30) as http:
            while True:
                started = time.perf_counter()
                assert http.get("/health").status_code == 200
                seconds.append(time.perf_counter() - started)
                if done.wait(0.05):
                    return

    thread = threading.Thread(target=probe)
    thread.start()
    try:
        yield seconds
    finally:
        done.set()
        thread.join()


def assert_refused(response: httpx.Response, key: str) -> None:
    assert response.status_code == 400, response.text[:300]
    error = response.json()["error"]
    assert error["code"] == 400 and error["type"] == "invalid_request_error", error
    assert key in error["message"], error


@pytest.fixture(scope="module")
def small_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    env = {
        "MLXCEL_SERVER__MAX_LOGPROB_ENTRIES": str(SMALL_BUDGET),
        "MLXCEL_SERVER__MAX_RESPONSE_BYTES": str(SMALL_BODY),
    }
    with serve(tmp_path_factory.mktemp("bounds"), "--profile", "target-only", env=env) as running:
        yield running


@pytest.mark.slow
def test_the_audits_amplification_is_a_quick_400_and_health_stays_responsive(target_only_server) -> None:
    with health_canary(target_only_server.url) as health, target_only_server.client() as http:
        started = time.perf_counter()
        response = http.post("/completion", json=AMPLIFICATION)
        took = time.perf_counter() - started
    assert_refused(response, "server.max_logprob_entries")
    assert took < 2.0 and len(response.content) < 1024
    assert health and max(health) < HEALTH_S, health


@pytest.mark.slow
def test_ordinary_logprob_requests_still_answer(target_only_server) -> None:
    """OpenAI's top_logprobs 20 on chat, and llama-server's n_probs on a list of prompts."""
    with target_only_server.client() as http:
        chat = {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 20}
        answer = http.post("/v1/chat/completions", json=chat | {"max_tokens": 8})
        assert answer.status_code == 200, answer.text[:300]
        assert all(len(e["top_logprobs"]) == 20 for e in answer.json()["choices"][0]["logprobs"]["content"])
        native = {"prompt": ["def f(x):", "class A:"], "n_probs": 10, "n_predict": 8, "temperature": 0}
        answer = http.post("/completion", json=native)
    assert answer.status_code == 200, answer.text[:300]
    assert all(len(body["completion_probabilities"]) == body["tokens_predicted"] for body in answer.json())


@pytest.fixture(scope="module")
def raised_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """Budgets an operator raised: room for a body of some 40 MB."""
    env = {"MLXCEL_SERVER__MAX_LOGPROB_ENTRIES": "600000", "MLXCEL_SERVER__MAX_RESPONSE_BYTES": str(128 << 20)}
    with serve(tmp_path_factory.mktemp("raised"), "--profile", "target-only", env=env) as running:
        yield running


@pytest.mark.slow
def test_a_large_body_is_built_off_the_event_loop(raised_server) -> None:
    """500 tokens x 1000 entries: shaping and encoding it held the event loop 3 s before."""
    large = {"prompt": "def f(x):", "n_probs": 999, "n_predict": 500, "temperature": 0, "ignore_eos": True}
    with health_canary(raised_server.url) as health, raised_server.client() as http:
        answer = http.post("/completion", json=large)
    assert answer.status_code == 200, answer.text[:300]
    assert len(answer.content) > 30_000_000
    assert max(health) < HEALTH_S, max(health)


@pytest.mark.slow
def test_a_row_past_its_share_at_run_time_is_a_400_and_the_server_serves_on(small_server) -> None:
    with small_server.client() as http:
        response = http.post("/completion", json=UNTIL_EOS)  # no n_predict: up to server.max_tokens
        assert_refused(response, "server.max_logprob_entries")
        refused = small_server.wait_for_event("request_bound_reached", response.headers["x-request-id"])
        assert "server.max_logprob_entries" in refused["reason"]
        exactly = http.post("/completion", json=UNTIL_EOS | {"n_predict": SMALL_BUDGET // 100})
        assert exactly.status_code == 200, exactly.text[:300]  # the whole share is usable
        assert len(exactly.json()["completion_probabilities"]) == SMALL_BUDGET // 100


@pytest.mark.slow
def test_a_streamed_row_past_its_share_ends_with_an_error_frame(small_server) -> None:
    with small_server.client() as http, http.stream("POST", "/completion", json=UNTIL_EOS | {"stream": True}) as sent:
        assert sent.status_code == 200
        frames = sse_frames(sent)
    entries = sum(len(f.get("completion_probabilities", [])) for f in frames[:-1])
    assert entries == SMALL_BUDGET // 100  # every token within the share went out, then the error
    error = frames[-1]["error"]
    assert error["code"] == 400 and "server.max_logprob_entries" in error["message"], error
    with small_server.client() as http:
        assert http.post("/completion", json={"prompt": "x", "n_predict": 2}).status_code == 200


@pytest.mark.slow
def test_a_body_over_max_response_bytes_is_a_400(small_server) -> None:
    """Four echoes of a 15,000-character prompt: text known before the body is shaped."""
    with small_server.client() as http:
        echoes = {"prompt": "=" * 15_000, "n": 4, "echo": True, "max_tokens": 1, "temperature": 0}
        response = http.post("/v1/completions", json=echoes)
        assert_refused(response, "server.max_response_bytes")
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        answer = http.post("/v1/chat/completions", json=chat)
        assert answer.status_code == 200, answer.text[:300]


@pytest.mark.slow
def test_a_huge_field_is_logged_capped(target_only_server) -> None:
    """A 60,000-character path: its 404 answer and its `http_request` line, capped."""
    with target_only_server.client() as http:
        response = http.get("/" + "p" * 60_000)
    assert response.status_code == 404
    line = target_only_server.wait_for_event("http_request", response.headers["x-request-id"])
    assert line["path"].endswith("...[55905 characters cut]")  # "/" and 4,095 p's kept
    assert len(json.dumps(line)) < FIELD_CAP + 1024
