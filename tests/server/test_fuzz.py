"""Schemathesis against the live server's OpenAPI schema: no 5xx but the documented 501s, and every
error in the envelope the schema documents (llama-server's; Ollama's `{"error": "..."}` on /api/*).

Every operation in /schema/openapi.json gets EXAMPLES generated cases that fit the schema and
EXAMPLES that do not (two tests, one server each), derandomized so a failure reproduces: 50 each
in the suite, MLXCEL_FUZZ_EXAMPLES=100 for the longer run docs/reliability.md quotes. A path that
only spells another one's route differently (`/chat/completions` beside `/v1/chat/completions`,
one handler, one schema: `aliases`) gets ALIAS_EXAMPLES: its cases would run the same validation
and handler again, and the chat and Responses aliases were a quarter of the fuzz's time (issue 44).
Generation is capped at 8 tokens and prompts at 256 tokens by the server's own limits.
A T = 0 canary completion before and after must agree: the fuzz must not leave the engine
wedged or serving different output.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import hypothesis
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from ops.bench.hostile import envelope_problem, ollama_error_problem
from tests.support.compat import OLLAMA, routes
from tests.support.server import serve

EXAMPLES = int(os.environ.get("MLXCEL_FUZZ_EXAMPLES", 50))
ALIAS_EXAMPLES = 10  # enough to see an alias routed to its handler and answering in its envelope
CALL_TIMEOUT_S = 30
CANARY = {"prompt": "def fibonacci(n):", "n_predict": 8, "temperature": 0}
LIMITS = {"MLXCEL_SERVER__MAX_TOKENS": "8", "MLXCEL_SERVER__MAX_PROMPT_TOKENS": "256"}


def as_openapi(route: str) -> str:
    """A compat/ route id ("METHOD /path/:param") with OpenAPI's path template ("/path/{param}")."""
    return re.sub(r":(\w+)", r"{\1}", route)  # /slots/:id_slot, /api/blobs/:digest


def documented_501s() -> set[str]:
    """Operations compat/ records as answering 501, in llama-server's manifest and Ollama's
    (`"METHOD /path"`, path templates as OpenAPI's)."""
    return {as_openapi(e.id) for e in [*routes(), *routes(OLLAMA)] if e.error and e.error.status == 501}


def aliases(schema: dict) -> set[str]:
    """ "METHOD /path" of each operation that another one serves: compat/ records it as served by
    another route (`aliased`, `served_as`), or it is the other's path without `/v1`; either way
    only where the two operations are documented alike (parameters, body and answers)."""

    def documented(method: str, path: str) -> str | None:
        operation = schema["paths"].get(path, {}).get(method.lower())
        if operation is None:
            return None
        return json.dumps({k: v for k, v in operation.items() if k not in ("operationId", "summary")}, sort_keys=True)

    served_as = {e.id: e.served_as for e in [*routes(), *routes(OLLAMA)] if e.state == "aliased" and e.served_as}
    found: dict[str, str] = {}  # alias -> the operation fuzzed in full
    for path, operations in schema["paths"].items():
        for method in operations:
            name = f"{method.upper()} {path}"
            serving = as_openapi(served_as.get(name, f"{method.upper()} /v1{path}"))
            if serving != name and documented(method, path) == documented(*serving.split(" ", 1)) is not None:
                found[name] = serving
    # a pair that names each other (/health and /v1/health): the one compat/ records as served by the other is the alias
    return {name for name, serving in found.items() if found.get(serving) != name or name in served_as}


def canary(url: str) -> str:
    response = requests.post(f"{url}/completion", json=CANARY, timeout=CALL_TIMEOUT_S)
    response.raise_for_status()
    return response.json()["content"]


def problem(method: str, path: str, response: requests.Response, allowed_501: set[str]) -> str | None:
    status = response.status_code
    documented_as = "GET" if method == "HEAD" else method  # HEAD answers what GET answers, headers only
    if status >= 500 and not (status == 501 and f"{documented_as} {path}" in allowed_501):
        return f"{status}: {response.text[:160]!r}"
    # each route's errors in the shape its schema documents: Ollama's routes answer Ollama's
    return ollama_error_problem(response) if path.startswith("/api/") else envelope_problem(response)


def fuzz_operation(
    url: str, operation, mode: GenerationMode, allowed_501: set[str], found: list[str], examples: int = EXAMPLES
) -> int:
    """Run `examples` cases of one operation in one mode; record problems instead of raising, so
    hypothesis does not spend the time budget shrinking. Returns the number of cases sent."""
    sent = 0

    @hypothesis.settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case) -> None:
        nonlocal sent
        sent += 1
        try:
            response = case.call(base_url=url, timeout=CALL_TIMEOUT_S)
        except requests.Timeout:
            found.append(f"{operation.method.upper()} {operation.path} [{mode}]: no answer in {CALL_TIMEOUT_S} s")
            return
        issue = problem(operation.method.upper(), operation.path, response, allowed_501)
        if issue:
            found.append(f"{operation.method.upper()} {operation.path} [{mode}]: {issue} <- {case.body!r:.200}")

    try:
        run()
    except Unsatisfiable:  # no way to break the schema of an operation without parameters or body
        assert mode is GenerationMode.NEGATIVE and sent == 0
    return sent


@pytest.mark.slow
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["fitting", "breaking"])
def test_fuzz_the_openapi_schema(tmp_path: Path, mode: GenerationMode) -> None:
    """One server per mode: each half is a test of its own (a minute or less), on either worker."""
    with serve(tmp_path, "--profile", "target-only", env=LIMITS) as server:
        before = canary(server.url)
        schema = schemathesis.openapi.from_url(f"{server.url}/schema/openapi.json")
        served_by_another = aliases(schema.raw_schema)
        allowed_501 = documented_501s()
        found: list[str] = []
        cases, started = 0, time.monotonic()
        operations = [result.ok() for result in schema.get_all_operations()]
        for operation in operations:
            alias = f"{operation.method.upper()} {operation.path}" in served_by_another
            examples = ALIAS_EXAMPLES if alias else EXAMPLES
            cases += fuzz_operation(server.url, operation, mode, allowed_501, found, examples)
        elapsed = time.monotonic() - started
        after = canary(server.url)
        health = requests.get(f"{server.url}/health", timeout=CALL_TIMEOUT_S)
    summary = {"mode": str(mode), "operations": len(operations), "aliases": len(served_by_another), "cases": cases}
    summary["problems"] = len(found)
    summary["seconds"] = round(elapsed, 1)
    print(f"fuzz: {json.dumps(summary)}")  # the case count the reliability notes quote
    assert found == [], "\n".join(found[:40])
    assert after == before, "the canary changed after the fuzz"
    assert health.status_code == 200


def test_the_schema_is_public_and_lists_the_request_structs(target_only_server) -> None:
    with target_only_server.client() as http:
        schema = http.get("/schema/openapi.json").json()
    assert schema["info"]["title"] == "mlxcel"
    body = schema["paths"]["/completion"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/CompletionRequest"}
    assert {"CompletionRequest", "ChatRequest", "TokenizeRequest"} <= set(schema["components"]["schemas"])
    # and the response Structs: every JSON answer names its shape
    answers = {
        ("/completion", "post"): "NativeCompletion",
        ("/v1/completions", "post"): "TextCompletion",
        ("/v1/chat/completions", "post"): "ChatCompletion",
        ("/props", "get"): "Props",
        ("/v1/models", "get"): "ModelList",
        ("/health", "get"): "Health",
    }
    for (path, method), struct in answers.items():
        ok = schema["paths"][path][method]["responses"]["200"]["content"]["application/json"]["schema"]
        assert ok == {"$ref": f"#/components/schemas/{struct}"}, path
    assert envelope_problem(http_404 := requests.get(f"{target_only_server.url}/schema/missing.json")) is None
    assert http_404.status_code == 404
