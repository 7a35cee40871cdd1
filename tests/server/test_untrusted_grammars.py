"""Issue 24's untrusted grammars against a real server: what used to crash, freeze or 500 it.

The server here has the pure-Python bounds opened wide (grammar.max_ref_depth, max_rules, ...),
so each case reaches the defence behind them: the worker process's crash isolation and time
limit, llguidance's row limits at the first mask, and the per-mask CPU budget. The bounds
themselves answer the same inputs with a 400 on a default server (tests/server/test_hostile_corpus.py).
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from ops.bench.canary import HealthCanary
from tests.support.server import RunningServer, serve

COMPLETION = {"prompt": "x", "n_predict": 4}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
OPEN_BOUNDS = {
    "MLXCEL_GRAMMAR__MAX_REF_DEPTH": "5000",
    "MLXCEL_GRAMMAR__MAX_DEFINITIONS": "5000",
    "MLXCEL_GRAMMAR__MAX_RULES": "100000",
    "MLXCEL_GRAMMAR__MAX_BYTES": "4000000",
    "MLXCEL_GRAMMAR__MAX_ALTERNATIVES": "100000",
    "MLXCEL_GRAMMAR__MAX_TOOLS": "10000",
    "MLXCEL_GRAMMAR__COMPILE_TIMEOUT_S": "4",  # the wide schemas compile in about 1 s on a loaded 2-core box
    "MLXCEL_GRAMMAR__MASK_BUDGET_MS": "30",
    "MLXCEL_SERVER__MAX_BODY_BYTES": "8000000",
}
# A thousand nested objects, each a definition: llguidance's compile recursed along the chain
# and overflowed its native stack, killing the server in 0.1 s.
DEEP_REFS = {
    "$ref": "#/$defs/d0",
    "$defs": {
        **{
            f"d{i}": {"type": "object", "properties": {"x": {"$ref": f"#/$defs/d{i + 1}"}}, "required": ["x"]}
            for i in range(1000)
        },
        "d1000": {"type": "string"},
    },
}
# 3000 rules of two alternatives (92 KB): GBNF conversion took about 5 s on the event loop.
MANY_RULES = "\n".join(
    ["root ::= r0", *(f'r{i} ::= "a" r{i + 1} | "b" r{i + 1}' for i in range(6000)), 'r6000 ::= "c"']
)
# Two required properties that refer to each other: no finite JSON satisfies it.
UNSATISFIABLE = {
    "type": "object",
    "properties": {"a": {"$ref": "#/$defs/A"}},
    "required": ["a"],
    "$defs": {"A": {"type": "object", "properties": {"b": {"$ref": "#/$defs/A"}}, "required": ["b"]}},
}
WIDE = {
    "anyOf": [
        {"type": "object", "properties": {f"k{i}": {"type": "integer"}}, "required": [f"k{i}"]} for i in range(3000)
    ]
}
AMBIGUOUS = "root ::= s\ns ::= s s | [a-z ]"  # each mask costs more as the output grows


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    with serve(tmp_path_factory.mktemp("grammars"), "--profile", "target-only", env=OPEN_BOUNDS) as running:
        yield running


def assert_refused(response: httpx.Response, *words: str) -> None:
    assert response.status_code == 400, response.text[:300]
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    for word in words:
        assert word in error["message"], error["message"]


def assert_serves(server: RunningServer) -> None:
    """Alive, compiling grammars, and no log line carries a schema or a grammar's text."""
    assert server.process.poll() is None, "the server died"
    longest = max(len(line) for line in server.log.read_text().splitlines())
    assert longest < 4000, f"a log line of {longest} characters"
    with server.client() as http:
        response = http.post("/completion", json={**COMPLETION, "json_schema": {"type": "integer"}})
    assert response.status_code == 200, response.text[:300]
    int(response.json()["content"])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/completion", {**COMPLETION, "json_schema": DEEP_REFS}),
        (
            "/v1/chat/completions",
            {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"schema": DEEP_REFS}}},
        ),
    ],
    ids=["json_schema", "response_format"],
)
def test_a_schema_that_overflows_the_compilers_stack_costs_the_worker_not_the_server(
    server: RunningServer, path: str, body: dict
) -> None:
    with server.client() as http:
        assert_refused(http.post(path, json=body), "crashed", "SIGSEGV")
    assert_serves(server)  # a fresh worker compiles the next grammar


@pytest.mark.slow
def test_a_crashing_tool_schema_is_refused_from_the_cache(server: RunningServer) -> None:
    """A tool's parameters sit at `properties.arguments` of the call schema; its pointers say so."""
    parameters = json.loads(json.dumps(DEEP_REFS).replace('"#/$defs/', '"#/properties/arguments/$defs/'))
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", **parameters}}}]
    body = {**CHAT, "tools": tools, "tool_choice": "required"}
    with server.client() as http:
        first = http.post("/v1/chat/completions", json=body)
        started = time.perf_counter()
        again = http.post("/v1/chat/completions", json=body)
    assert_refused(first, "crashed")
    assert_refused(again, "crashed")
    assert time.perf_counter() - started < 0.5, "a repeated schema is answered from the cache"
    assert_serves(server)


@pytest.mark.slow
def test_a_grammar_that_compiles_too_long_is_a_400_and_every_route_keeps_answering(server: RunningServer) -> None:
    with HealthCanary(server.url) as canary, server.client() as http:
        response = http.post("/completion", json={**COMPLETION, "grammar": MANY_RULES})
    assert_refused(response, "compiling took more than 4 s of CPU (grammar.compile_timeout_s)")
    assert canary.slowest < 1.0, f"/health took {canary.slowest:.2f} s during the compile"
    assert_serves(server)


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_schema_over_the_row_limits_is_a_400_before_any_row(server: RunningServer, stream: bool) -> None:
    with server.client() as http:
        response = http.post("/completion", json={**COMPLETION, "json_schema": WIDE, "stream": stream})
    assert_refused(response, "fails at the first token", "max is 2000")


@pytest.mark.slow
def test_thousands_of_required_tools_are_a_400(server: RunningServer) -> None:
    tools = [{"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object"}}} for i in range(3000)]
    with server.client() as http:
        response = http.post("/v1/chat/completions", json={**CHAT, "tools": tools, "tool_choice": "required"})
    assert_refused(response, "fails at the first token")


@pytest.mark.slow
def test_an_unsatisfiable_schema_is_a_400(server: RunningServer) -> None:
    with server.client() as http:
        assert_refused(http.post("/completion", json={**COMPLETION, "json_schema": UNSATISFIABLE}), "first token")


@pytest.mark.slow
def test_a_row_whose_masks_overrun_the_budget_ends_alone(server: RunningServer) -> None:
    """Four rows of an ambiguous grammar end with a 400; a concurrent request is not held up."""
    outcome: dict[str, httpx.Response] = {}

    def ambiguous() -> None:
        body = {"prompt": "x", "max_tokens": 200, "n": 4, "grammar": AMBIGUOUS, "temperature": 1.0, "seed": 1}
        with server.client() as http:
            outcome["ambiguous"] = http.post("/v1/completions", json=body)

    thread = threading.Thread(target=ambiguous)
    thread.start()
    time.sleep(0.3)
    started = time.perf_counter()
    with server.client() as http:
        canary = http.post("/completion", json={"prompt": "def f(n):", "n_predict": 16, "temperature": 0})
    canary_s = time.perf_counter() - started
    thread.join()
    assert canary.status_code == 200
    assert canary_s < 3.0, f"the canary took {canary_s:.1f} s beside the ambiguous rows"
    assert_refused(outcome["ambiguous"], "grammar.mask_")  # a mask's budget, or the row's mean (mask_mean_ms)
    assert_serves(server)
