"""Strict decoding and the HTTP layer's own errors, over real HTTP against a real server.

Every bad request must get a 4xx in the error envelope and leave the server serving: each test
ends with a canary completion.
"""

from __future__ import annotations

import socket

import httpx
import pytest
import structlog
from litestar import Litestar, get
from litestar.testing import TestClient
from structlog.testing import capture_logs

from app.server.errors import HANDLERS
from ops.bench.hostile import POST_ROUTES
from tests.support.server import API_KEY

GET_ROUTES = ["/health", "/v1/health", "/v1/models", "/models", "/props", "/slots", "/metrics"]
FLOAT_FIELDS = [
    "temperature",
    "top_p",
    "min_p",
    "repeat_penalty",
    "presence_penalty",
    "frequency_penalty",
    "xtc_probability",
    "xtc_threshold",
    "speculative.p_min",
]


def assert_error(response: httpx.Response, code: int, fragment: str) -> None:
    assert response.status_code == code, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["type"] == "invalid_request_error"
    assert fragment.lower() in error["message"].lower(), error["message"]


def assert_serving(http: httpx.Client, **kw) -> None:
    canary = http.post("/completion", json={"prompt": "def add(a, b):", "n_predict": 4, "temperature": 0}, **kw)
    assert canary.status_code == 200 and canary.json()["tokens_predicted"] == 4


def post_raw(http: httpx.Client, route: str, body: bytes, **kw) -> httpx.Response:
    return http.post(route, content=body, headers={"content-type": "application/json", **kw.pop("headers", {})}, **kw)


def nested(depth: int) -> bytes:
    """A completion body whose ignored `extra` field makes the whole body `depth` levels deep."""
    inner = b"[" * (depth - 1) + b"]" * (depth - 1)
    return b'{"prompt": "x", "n_predict": 2, "extra": ' + inner + b"}"


@pytest.mark.parametrize("route", POST_ROUTES)
def test_invalid_utf8_gets_400_on_every_json_route(default_server, route) -> None:
    with default_server.client() as http:
        assert_error(post_raw(http, route, b'{"prompt": "\xff\xfe", "content": "\xc3("}'), 400, "not valid UTF-8")
        assert_serving(http)


@pytest.mark.parametrize("depth", [65, 5000, 200_000])
def test_json_nested_deeper_than_max_json_depth_gets_400(default_server, depth) -> None:
    with default_server.client() as http:
        assert_error(post_raw(http, "/completion", nested(depth)), 400, "deeper than 64 levels")
        assert post_raw(http, "/completion", nested(64)).status_code == 200  # the limit itself is fine
        assert_serving(http)


@pytest.mark.parametrize(
    ("bias", "fragment"),
    [
        ({"5": "x"}, "logit_bias"),
        ([[5, "x"]], "logit_bias"),
        ({"5": True}, "number or false"),
        ([[5, True]], "number or false"),
        ([[5]], "length 2"),
        ([[5, 1.0, 2.0]], "length 2"),
        ([5], "logit_bias"),
        ([[5.5, 1.0]], "logit_bias"),
        ([[[5], 1.0]], "logit_bias"),
        ({"5": "nan"}, "finite"),
        ([[5, "-inf"]], "finite"),
        ({"99999999": 1.0}, "outside the vocabulary"),
    ],
)
def test_malformed_logit_bias_gets_400(default_server, bias, fragment) -> None:
    with default_server.client() as http:
        assert_error(http.post("/completion", json={"prompt": "x", "logit_bias": bias}), 400, fragment)
        assert_serving(http)


@pytest.mark.parametrize("key", ["١٢", "²", "12 ", "1_2"])
def test_logit_bias_keys_that_are_not_ascii_digits_are_text(default_server, key) -> None:
    """As llama-server's strtol: only ASCII digits name an id; any other key is tokenized."""
    with default_server.client() as http:
        response = http.post("/completion", json={"prompt": "x", "n_predict": 2, "logit_bias": {key: -1.0}})
        assert response.status_code == 200, response.text
        text_ids = http.post("/tokenize", json={"content": key}).json()["tokens"]
        reported = response.json()["generation_settings"]["logit_bias"]
        assert sorted(reported, key=lambda e: e["token"]) == [{"bias": -1.0, "token": t} for t in sorted(set(text_ids))]


def test_logit_bias_false_bans_the_token(default_server) -> None:
    request = {"prompt": "def add(a, b):", "n_predict": 1, "temperature": 0, "return_tokens": True}
    with default_server.client() as http:
        first = http.post("/completion", json=request).json()["tokens"][0]
        for bias in ({str(first): False}, [[first, False]]):
            banned = http.post("/completion", json={**request, "logit_bias": bias}).json()
            assert banned["tokens"][0] != first


@pytest.mark.parametrize("field", FLOAT_FIELDS)
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "Infinity"])
def test_non_finite_numbers_get_400(default_server, field, value) -> None:
    with default_server.client() as http:
        assert_error(
            http.post("/completion", json={"prompt": "x", field: value}), 400, f"{field}: numbers must be finite"
        )
        assert_serving(http)


@pytest.mark.parametrize(
    ("literal", "fragment"),
    [(b"NaN", "malformed"), (b"Infinity", "malformed"), (b"-Infinity", "malformed"), (b"1e400", "out of range")],
)
def test_non_finite_json_literals_get_400(default_server, literal, fragment) -> None:
    with default_server.client() as http:
        body = b'{"prompt": "x", "n_predict": 2, "temperature": ' + literal + b"}"
        assert_error(post_raw(http, "/completion", body), 400, fragment)
        assert_serving(http)


def test_head_on_every_get_route_answers_headers_only(default_server) -> None:
    with default_server.client() as http:
        for route in GET_ROUTES:
            head, full = http.head(route), http.get(route)
            assert head.status_code == full.status_code == 200, route
            assert head.content == b"" and head.headers["content-type"] == full.headers["content-type"]
        assert int(http.head("/health").headers["content-length"]) == len(http.get("/health").content)


def test_405_names_the_allowed_methods_in_the_envelope(default_server) -> None:
    with default_server.client() as http:
        for method, route, allowed in [
            ("GET", "/completion", "OPTIONS, POST"),
            ("PUT", "/health", "GET, HEAD, OPTIONS"),
            ("DELETE", "/v1/models", "GET, HEAD, OPTIONS"),
        ]:
            response = http.request(method, route)
            assert_error(response, 405, "method not allowed")
            assert sorted(response.headers["allow"].split(", ")) == allowed.split(", ")
            options = http.options(route)
            assert options.status_code == 204 and sorted(options.headers["allow"].split(", ")) == allowed.split(", ")
        assert_serving(http)


def test_cors_preflight_and_simple_requests(default_server) -> None:
    origin = {"Origin": "http://app.example"}
    preflight = {
        **origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type, x-custom-header",
    }
    with default_server.client() as http:
        answer = http.options("/v1/chat/completions", headers=preflight)
        assert answer.status_code == 200  # as llama-server answers a preflight (Litestar's own is 204)
        assert answer.headers["access-control-allow-origin"] == "*"  # the default ["*"]: no credentials
        assert "POST" in answer.headers["access-control-allow-methods"]
        allowed = {name.strip().lower() for name in answer.headers["access-control-allow-headers"].split(",")}
        assert {"authorization", "content-type", "x-custom-header"} <= allowed  # the requested ones, echoed
        simple = http.post("/completion", json={"prompt": "x", "n_predict": 2}, headers=origin)
        assert simple.headers["access-control-allow-origin"] == "*"
        assert "x-request-id" in simple.headers["access-control-expose-headers"]


def test_malformed_http_gets_the_envelope_and_a_json_log_line(default_server) -> None:
    head, body = exchange(default_server, b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ")
    assert b"content-type: application/json" in head.lower()
    assert httpx.Response(400, content=body).json()["error"] == {
        "code": 400,
        "message": "Invalid HTTP request received.",
        "type": "invalid_request_error",
    }
    warnings = default_server.events("http_protocol_warning")
    assert warnings and warnings[-1]["message"] == "Invalid HTTP request received."
    with default_server.client() as http:
        assert_serving(http)


def exchange(server, request: bytes) -> tuple[bytes, bytes]:
    """`request` sent on a fresh connection; the answer's head and body, read until the server
    closes (a connection it leaves open fails the read's timeout)."""
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        raw.sendall(request)
        reply = b""
        while chunk := raw.recv(65536):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    return head, body


@pytest.mark.parametrize("hosts", [(b"127.0.0.1", b"rebound.example"), (b"rebound.example", b"127.0.0.1")])
def test_two_host_headers_get_400(default_server, hosts) -> None:
    """Either order: the last Host was the one checked, so a rebound name came through first."""
    lines = b"".join(b"Host: " + host + b"\r\n" for host in hosts)
    head, body = exchange(default_server, b"GET /props HTTP/1.1\r\n" + lines + b"Connection: close\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ")
    assert_error(httpx.Response(400, content=body), 400, "2 Host headers")


def test_schema_paths_not_served_get_the_envelope(default_server) -> None:
    with default_server.client() as http:
        for path in ("/schema/nothing", "/schema/openapi.yaml", "/schema/a/b"):
            answer = http.get(path)
            assert answer.status_code == 404 and answer.headers["content-type"] == "application/json", path
            assert answer.json()["error"] == {
                "code": 404,
                "message": f"File Not Found: GET {path}",
                "type": "not_found_error",
            }
        assert http.get("/schema").headers["content-type"] == "text/html; charset=utf-8"  # the docs page itself


def test_the_page_names_its_charset_once(default_server) -> None:
    with default_server.client() as http:
        assert http.get("/").headers["content-type"] == "text/html; charset=utf-8"


def test_an_upgrade_is_answered_and_the_connection_closed(default_server) -> None:
    """No route serves a WebSocket: 426 in the envelope. Another protocol's Upgrade (h2c, as curl
    --http2 sends) is ignored, as HTTP allows: the request is served. Either way the server closes
    (`exchange` reads until it does)."""
    websocket = b"Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
    h2c = b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n"
    head, body = exchange(default_server, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + websocket + b"\r\n")
    assert head.startswith(b"HTTP/1.1 426 ") and b"connection: close" in head.lower()
    assert_error(httpx.Response(426, content=body), 426, "WebSocket")
    head, body = exchange(default_server, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + h2c + b"\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and body == b'{"status":"ok"}'


def test_a_500_logs_type_traceback_and_the_error_id_it_names() -> None:
    """Every 500 left is named by an id that the log line with its traceback carries."""

    @get("/boom")
    async def boom() -> None:
        raise KeyError("the cause")

    # Another test may have left structlog filtering below CRITICAL (offline commands silence it).
    saved = structlog.get_config()
    structlog.reset_defaults()
    try:
        with capture_logs() as logs, TestClient(Litestar([boom], exception_handlers=HANDLERS)) as http:
            response = http.get("/boom")
    finally:
        structlog.configure(**saved)
    assert response.status_code == 500
    [line] = [e for e in logs if e["event"] == "unhandled_error"]
    # The JSON renderer turns exc_info into the `exception` key, the formatted traceback.
    assert line["error_type"] == "KeyError" and isinstance(line["exc_info"], KeyError)
    assert line["error_id"] in response.json()["error"]["message"]


@pytest.mark.slow
def test_with_an_api_key_options_and_health_need_none_and_big_bodies_get_413(keyed_server) -> None:
    with keyed_server.client() as http:  # server.max_body_bytes 4096, server.max_json_depth 512
        keyed = {"Authorization": f"Bearer {API_KEY}"}
        assert http.head("/health").status_code == 200
        for route in ("/health", "/completion", "/v1/chat/completions"):
            assert http.options(route).status_code == 204, route
        preflight = {"Origin": "http://app.example", "Access-Control-Request-Method": "POST"}
        answer = http.options("/v1/chat/completions", headers=preflight)
        assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == "http://app.example"
        assert http.head("/props").status_code == 401
        assert http.get("/props").status_code == 401
        big = {"prompt": "x" * 5000, "n_predict": 2}
        assert_error(http.post("/completion", json=big, headers=keyed), 413, "server.max_body_bytes")
        # past the profile's largest depth limit, and past what msgspec decodes
        assert_error(post_raw(http, "/completion", nested(1000), headers=keyed), 400, "server.max_json_depth")
        assert_serving(http, headers=keyed)
