"""Hostile requests and the error envelope, shared by the corpus test, the fuzz test and the soak.

Each `Hostile` is one input from issue 10's audit with the status the fixed server documents for
it (docs/reliability.md). None of them may get a 5xx, and every error answer is
`{"error": {"code", "message", "type"}}` with `code` equal to the HTTP status.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx

POST_ROUTES = (
    "/completion",
    "/completions",
    "/v1/completions",
    "/v1/chat/completions",
    "/chat/completions",
    "/tokenize",
    "/detokenize",
    "/apply-template",
)
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
PROMPT = {"prompt": "def f(x):", "n_predict": 2, "temperature": 0}


@dataclass(frozen=True)
class Hostile:
    name: str
    method: str
    path: str
    status: int
    body: Any = None  # JSON-encoded when not bytes
    headers: dict[str, str] = field(default_factory=dict)

    def send(self, http: httpx.Client) -> httpx.Response:
        content = self.body if isinstance(self.body, bytes | None) else json.dumps(self.body).encode()
        headers = {"Content-Type": "application/json", **self.headers} if content is not None else self.headers
        return http.request(self.method, self.path, content=content, headers=headers)


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def corpus(max_body_bytes: int = 16 * 1024 * 1024) -> list[Hostile]:
    """The audit's inputs that answered 5xx, hung or served wrong output, with their fixed status.

    Seeds of any size are reduced to the key range (llama-server takes any integer), so they
    answer 200; `max_body_bytes` is the serving profile's, for the 413 case."""
    cases = [
        Hostile(
            "chat_template_kwargs.chat_template",
            "POST",
            "/v1/chat/completions",
            400,
            {**CHAT, "chat_template_kwargs": {"chat_template": "{% for i in range(10) %}x{% endfor %}"}},
        ),
        Hostile(
            "chat_template_kwargs.return_tensors",
            "POST",
            "/v1/chat/completions",
            400,
            {**CHAT, "chat_template_kwargs": {"return_tensors": "np"}},
        ),
        Hostile("nesting 10000 deep", "POST", "/completion", 400, nested(10_000)),
        Hostile(
            "nesting 10000 deep in a field",
            "POST",
            "/completion",
            400,
            b'{"prompt": "x", "logit_bias": ' + nested(10_000) + b"}",
        ),
        Hostile("logit_bias string bias", "POST", "/completion", 400, {**PROMPT, "logit_bias": {"15": "abc"}}),
        Hostile("logit_bias list string bias", "POST", "/completion", 400, {**PROMPT, "logit_bias": [[15, "abc"]]}),
        # Only ASCII digits spell a token id (llama-server's parse); any other key is text to bias.
        Hostile("logit_bias non-ASCII digit key", "POST", "/completion", 200, {**PROMPT, "logit_bias": {"١٢": 1.0}}),
        Hostile("temperature 'nan'", "POST", "/completion", 400, {**PROMPT, "temperature": "nan"}),
        Hostile("temperature 'inf'", "POST", "/completion", 400, {**PROMPT, "temperature": "inf"}),
        Hostile("top_p 'nan'", "POST", "/v1/completions", 400, {**PROMPT, "top_p": "nan"}),
        Hostile("repeat_penalty 'nan'", "POST", "/completion", 400, {**PROMPT, "repeat_penalty": "nan"}),
        Hostile("presence_penalty 'nan'", "POST", "/v1/chat/completions", 400, {**CHAT, "presence_penalty": "nan"}),
        Hostile("frequency_penalty '-inf'", "POST", "/completion", 400, {**PROMPT, "frequency_penalty": "-inf"}),
        Hostile("2000 stop strings of 400 chars", "POST", "/completion", 400, {**PROMPT, "stop": ["s" * 400] * 2000}),
        Hostile("17 stop strings", "POST", "/completion", 400, {**PROMPT, "stop": [f"s{i}" for i in range(17)]}),
        Hostile("one stop string of 257 chars", "POST", "/completion", 400, {**PROMPT, "stop": "s" * 257}),
        Hostile(
            "body over max_body_bytes", "POST", "/completion", 413, b'{"prompt": "' + b"x" * max_body_bytes + b'"}'
        ),
        Hostile("n_predict -2", "POST", "/completion", 400, {**PROMPT, "n_predict": -2}),
        # Issue 24's amplification: 8 x 300 x 1001 log-probability entries (a 200 MB answer before)
        Hostile(
            "8 prompts x n_probs 1000 x n_predict 300",
            "POST",
            "/completion",
            400,
            {"prompt": ["def f(x):"] * 8, "n_probs": 1000, "n_predict": 300},
        ),
        Hostile("unknown route", "GET", "/no-such-route", 404),
        Hostile("wrong method", "GET", "/completion", 405),
    ]
    cases += grammar_cases()
    cases += round_four_cases()
    cases += [Hostile(f"invalid UTF-8 on {path}", "POST", path, 400, b'{"prompt": "\xff\xfe"}') for path in POST_ROUTES]
    # Last: before issue 10's fix these killed the engine thread, hanging every later request.
    cases += [
        Hostile("seed 2**64", "POST", "/completion", 200, {**PROMPT, "seed": 2**64}),
        Hostile("seed 2**70", "POST", "/completion", 200, {**PROMPT, "seed": 2**70}),
        Hostile("seed -1 (random)", "POST", "/completion", 200, {**PROMPT, "seed": -1}),
        Hostile("seed -12345", "POST", "/completion", 200, {**PROMPT, "seed": -12345}),
    ]
    return cases


RESPONSE = {"model": "x", "input": "hi", "max_output_tokens": 2}


def round_four_cases() -> list[Hostile]:
    """Issue 34's wrong answers and 500s that one request makes (its stalls and the listener's
    attacks are ops/bench/attacks.py's): each is a 400 now, or a right 200."""
    escapes = b'{"prompt": "x", "n_predict": 1, "x": ' + b"[" * 70 + b'"' + b'\\"' * 16_000
    function_call = {"type": "function_call", "call_id": 7, "name": "f", "arguments": "{}"}
    return [
        Hostile("70 [ then 32 KB of unterminated escaped quotes", "POST", "/completion", 400, escapes),
        Hostile("frequency_penalty 1e39", "POST", "/completion", 400, {**PROMPT, "frequency_penalty": 1e39}),
        Hostile("presence_penalty -1e39", "POST", "/v1/chat/completions", 400, {**CHAT, "presence_penalty": -1e39}),
        Hostile("logit_bias 1e39", "POST", "/completion", 400, {**PROMPT, "logit_bias": {"15": 1e39}}),
        Hostile("repeat_penalty 1e-300", "POST", "/completion", 400, {**PROMPT, "repeat_penalty": 1e-300}),
        Hostile("dry_base 1e40", "POST", "/completion", 400, {**PROMPT, "dry_multiplier": 0.8, "dry_base": 1e40}),
        Hostile("top_p 0 (the top token)", "POST", "/completion", 200, {**PROMPT, "temperature": 1.0, "top_p": 0.0}),
        Hostile("responses tool name a number", "POST", "/v1/responses", 400,
                {**RESPONSE, "tools": [{"type": "function", "name": 5}]}),
        Hostile("responses tool parameters a list", "POST", "/v1/responses", 400,
                {**RESPONSE, "tools": [{"type": "function", "name": "f", "parameters": [1]}]}),
        Hostile("responses tool without a name", "POST", "/v1/responses", 400,
                {**RESPONSE, "tools": [{"type": "function"}]}),
        Hostile("responses call_id a number", "POST", "/v1/responses", 400, {**RESPONSE, "input": [function_call]}),
    ]  # fmt: skip


def chain_schema(links: int, pointer: str = "#/$defs/") -> dict[str, Any]:
    """Nested objects, each a definition `$ref`-ing the next: llguidance recursed along the chain
    (a thousand deep overflowed its native stack and killed the server)."""
    defs = {
        f"d{i}": {"type": "object", "properties": {"x": {"$ref": f"{pointer}d{i + 1}"}}, "required": ["x"]}
        for i in range(links)
    }
    return {"$ref": f"{pointer}d0", "$defs": defs | {f"d{links}": {"type": "string"}}}


def tools_body(parameters: Any, tool_choice: Any = "required", count: int = 1) -> dict[str, Any]:
    tools = [{"type": "function", "function": {"name": f"f{i}", "parameters": parameters}} for i in range(count)]
    return {**CHAT, "tools": tools, "tool_choice": tool_choice}


def grammar_cases() -> list[Hostile]:
    """Issue 24's untrusted grammars: each once killed, froze or 500ed the server; each is a 400
    now (the bounds of docs/structured-output.md, or the compile worker behind them)."""
    many_rules = "\n".join(["root ::= r0", *(f'r{i} ::= "a" r{i + 1} | "b"' for i in range(3000)), 'r3000 ::= "c"'])
    wide = {"anyOf": [{"const": f"v{i}"} for i in range(5000)]}
    unsatisfiable = {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/A"}},
        "required": ["a"],
        "$defs": {"A": {"type": "object", "properties": {"b": {"$ref": "#/$defs/A"}}, "required": ["b"]}},
    }
    long_name = {"type": "object", "properties": {"k" * 5000: {"type": "string"}}}
    response_format = {"type": "json_schema", "json_schema": {"name": "x", "schema": chain_schema(1000)}}
    return [
        Hostile(
            "json_schema $ref chain 1000 deep",
            "POST",
            "/completion",
            400,
            {**PROMPT, "json_schema": chain_schema(1000)},
        ),
        Hostile(
            "response_format $ref chain 1000 deep",
            "POST",
            "/v1/chat/completions",
            400,
            {**CHAT, "response_format": response_format},
        ),
        Hostile(
            "tool parameters $ref chain 1000 deep",
            "POST",
            "/v1/chat/completions",
            400,
            tools_body(chain_schema(1000, "#/properties/arguments/$defs/")),
        ),
        Hostile("GBNF of 3000 rules", "POST", "/completion", 400, {**PROMPT, "grammar": many_rules}),
        Hostile("anyOf of 5000 branches", "POST", "/completion", 400, {**PROMPT, "json_schema": wide}),
        Hostile(
            "3000 tools under tool_choice required",
            "POST",
            "/v1/chat/completions",
            400,
            tools_body({"type": "object"}, count=3000),
        ),
        Hostile("a property name of 5000 chars", "POST", "/completion", 400, {**PROMPT, "json_schema": long_name}),
        Hostile("unsatisfiable schema", "POST", "/completion", 400, {**PROMPT, "json_schema": unsatisfiable}),
        Hostile(
            "tool_choice function a string",
            "POST",
            "/v1/chat/completions",
            400,
            tools_body({"type": "object"}, {"type": "function", "function": "f0"}),
        ),
        Hostile(
            "tool_choice function a list",
            "POST",
            "/v1/chat/completions",
            400,
            tools_body({"type": "object"}, {"type": "function", "function": ["f0"]}),
        ),
        Hostile(
            "tool parameters of type string",
            "POST",
            "/v1/chat/completions",
            400,
            tools_body({"type": "string"}, "auto"),
        ),
    ]


def envelope_problem(response: httpx.Response | Any) -> str | None:
    """Why an error response is not llama-server's envelope, or None when it is (or is no error).

    Takes httpx's or requests' responses (schemathesis calls through requests)."""
    if response.status_code < 400 or response.request.method == "HEAD":  # HEAD carries no body
        return None
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        return f"{response.status_code} without the envelope: {response.text[:120]!r}"
    if not isinstance(error, dict) or error.get("code") != response.status_code:
        return f"{response.status_code} with a mismatched envelope: {error!r:.120}"
    if not isinstance(error.get("message"), str) or not isinstance(error.get("type"), str):
        return f"{response.status_code} envelope lacks message or type: {error!r:.120}"
    return None


def ollama_error_problem(response: httpx.Response | Any) -> str | None:
    """Why an error response of an Ollama route (`/api/...`) is not Ollama's shape, `{"error": "..."}`
    with a message (app/server/ollama/routes.py `ollama_error`), or None when it is (or is no error)."""
    if response.status_code < 400 or response.request.method == "HEAD":
        return None
    try:
        body = response.json()
    except ValueError:
        return f"{response.status_code} without Ollama's error shape: {response.text[:120]!r}"
    if not isinstance(body, dict) or set(body) != {"error"} or not isinstance(body["error"], str) or not body["error"]:
        return f"{response.status_code} not Ollama's error shape: {body!r:.120}"
    return None
