"""Issue 10's hostile inputs, one case each: the documented status, never a 5xx, the error
envelope, and a server that still answers a completion afterwards.

The cases live in ops/bench/hostile.py (the soak test sends them too). This module runs them on
its own server so that an input that kills the engine cannot hang the shared fixtures.
"""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from ops.bench.hostile import PROMPT, Hostile, corpus, envelope_problem
from tests.support.server import API_KEY, RunningServer, serve

MAX_BODY_BYTES = 2 * 1024 * 1024  # small enough to send cheaply, above the 2,000 stop strings
TIMEOUT_S = 30  # a hostile request or the completion after it taking longer counts as a hang
CASES = corpus(MAX_BODY_BYTES)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    env = {"MLXCEL_SERVER__MAX_BODY_BYTES": str(MAX_BODY_BYTES)}
    with serve(tmp_path_factory.mktemp("hostile"), "--profile", "target-only", env=env) as running:
        yield running


def still_serves(server: RunningServer) -> None:
    with httpx.Client(base_url=server.url, timeout=TIMEOUT_S) as http:
        assert http.get("/health").status_code == 200
        response = http.post("/completion", json=PROMPT)
        assert response.status_code == 200, response.text
        assert response.json()["tokens_predicted"] == PROMPT["n_predict"]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_input(server: RunningServer, case: Hostile) -> None:
    with httpx.Client(base_url=server.url, timeout=TIMEOUT_S) as http:
        response = case.send(http)
    assert response.status_code == case.status, response.text[:300]
    assert envelope_problem(response) is None, envelope_problem(response)
    still_serves(server)


@pytest.mark.slow
def test_head_on_get_routes(server: RunningServer) -> None:
    with httpx.Client(base_url=server.url, timeout=TIMEOUT_S) as http:
        for path in ("/health", "/v1/models", "/metrics"):
            response = http.head(path)
            assert response.status_code == 200, path
            assert response.content == b"", path


@pytest.mark.slow
def test_a_wrong_method_names_the_allowed_ones(server: RunningServer) -> None:
    with httpx.Client(base_url=server.url, timeout=TIMEOUT_S) as http:
        for method, path, allowed in (
            ("GET", "/completion", "POST"),
            ("POST", "/health", "GET"),
            ("PUT", "/slots", "GET"),
        ):
            response = http.request(method, path)
            assert response.status_code == 405, (method, path)
            assert envelope_problem(response) is None, envelope_problem(response)
            assert allowed in response.headers.get("allow", ""), (method, path, response.headers)


def preflight(http: httpx.Client, path: str) -> httpx.Response:
    # An origin every test server allows (the keyed server lists its origins: tests/conftest.py).
    headers = {"Origin": "http://app.example", "Access-Control-Request-Method": "POST"}
    return http.options(path, headers=headers)


@pytest.mark.slow
def test_cors_preflight(server: RunningServer) -> None:
    with httpx.Client(base_url=server.url, timeout=TIMEOUT_S) as http:
        response = preflight(http, "/v1/chat/completions")
    assert 200 <= response.status_code < 300, response.text
    assert "access-control-allow-origin" in response.headers, response.headers


def raw_exchange(url: str, payload: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send bytes that are not valid HTTP; return the status, headers and body answered."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
        sock.sendall(payload)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in header_lines)}
    return int(status_line.split()[1]), headers, body


MALFORMED = {
    "garbage request line": b"NOT HTTP AT ALL\r\n\r\n",
    "bad content-length": b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    "header without colon": b"GET /health HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n",
}


@pytest.mark.slow
@pytest.mark.parametrize("payload", MALFORMED.values(), ids=list(MALFORMED))
def test_malformed_http_gets_400(server: RunningServer, payload: bytes) -> None:
    status, headers, body = raw_exchange(server.url, payload)
    assert status == 400
    if headers.get("content-type", "").startswith("application/json"):
        assert json.loads(body)["error"]["code"] == 400
    still_serves(server)


@pytest.mark.slow
def test_with_a_key_preflight_and_health_are_open_and_completion_is_not(keyed_server: RunningServer) -> None:
    with httpx.Client(base_url=keyed_server.url, timeout=TIMEOUT_S) as http:
        for path in ("/completion", "/health", "/v1/chat/completions"):
            response = preflight(http, path)
            assert 200 <= response.status_code < 300, (path, response.text)
        assert http.get("/health").status_code == 200
        assert http.head("/health").status_code == 200
        refused = http.post("/completion", json=PROMPT)
        assert refused.status_code == 401 and envelope_problem(refused) is None
        allowed = http.post("/completion", json=PROMPT, headers={"Authorization": f"Bearer {API_KEY}"})
        assert allowed.status_code == 200, allowed.text
