"""Generated JSON schemas and GBNF grammars against a live server: no 5xx, /health never stalls.

Issue 24's classes, generated at bounded sizes from a fixed seed: deep `$ref` chains, `$ref`
cycles, wide `anyOf`, many GBNF rules, ambiguous grammars, long property names, contradictory
and malformed ones, among ordinary ones; each sent through one of `json_schema`, `grammar`,
`response_format` and a required tool's `parameters`. A thread polls /health throughout: every
answer must come within 1 s (the compile runs in the worker process, off the event loop). The
counts print as `grammar-fuzz: {...}` (docs/reliability.md quotes them).
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from typing import Any

import httpx
import pytest

from ops.bench.canary import HealthCanary
from ops.bench.hostile import chain_schema, envelope_problem
from tests.support.server import serve

SEED = 24
CASES = 200
LIMITS = {"MLXCEL_SERVER__MAX_TOKENS": "8", "MLXCEL_SERVER__MAX_BODY_BYTES": "8000000"}
PROMPT = {"prompt": "{", "n_predict": 8}
CHAT = {"messages": [{"role": "user", "content": "answer"}], "max_tokens": 8}


def ref_cycle(rng: random.Random) -> dict[str, Any]:
    names = [f"n{i}" for i in range(rng.randint(2, 6))]
    defs = {
        name: {"type": "object", "properties": {"next": {"$ref": f"#/$defs/{names[(i + 1) % len(names)]}"}}}
        for i, name in enumerate(names)
    }
    if rng.random() < 0.5:  # a required link: no finite output
        defs[names[0]]["required"] = ["next"]
    return {"$ref": f"#/$defs/{names[0]}", "$defs": defs}


def wide(rng: random.Random) -> dict[str, Any]:
    count = rng.choice([10, 200, 1200, 3000])
    if rng.random() < 0.5:
        return {"anyOf": [{"const": f"v{i}"} for i in range(count)]}
    return {"oneOf": [{"type": "object", "properties": {f"k{i}": {"type": "integer"}}} for i in range(count)]}


def long_name(rng: random.Random) -> dict[str, Any]:
    name = "k" * rng.choice([16, 900, 5000, 50_000])
    return {"type": "object", "properties": {name: {"type": "string"}}, "required": [name]}


def nested(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    """An ordinary schema: objects, arrays, enums, patterns, numbers."""
    pick = rng.random()
    if depth > 3 or pick < 0.3:
        return rng.choice([
            {"type": "integer", "minimum": 0, "maximum": rng.randint(1, 1000)},
            {"type": "string", "maxLength": rng.randint(1, 20)},
            {"type": "string", "pattern": "^[a-z]{1,5}[0-9]?$"},
            {"enum": ["red", "green", "blue"]},
            {"type": "boolean"},
            {"type": "string", "minLength": 5, "maxLength": 2},  # contradictory
        ])  # fmt: skip
    if pick < 0.6:
        return {"type": "array", "items": nested(rng, depth + 1), "maxItems": rng.randint(0, 3)}
    keys = [f"p{i}" for i in range(rng.randint(1, 4))]
    return {
        "type": "object",
        "properties": {key: nested(rng, depth + 1) for key in keys},
        "required": rng.sample(keys, rng.randint(0, len(keys))),
        "additionalProperties": rng.random() < 0.5,
    }


def many_rules(rng: random.Random) -> str:
    count = rng.choice([20, 300, 900, 1500])
    rules = [f'r{i} ::= "a" r{i + 1} | "b" r{i + 1}' for i in range(count)]
    return "\n".join(["root ::= r0", *rules, f'r{count} ::= "c"'])


def ambiguous(rng: random.Random) -> str:
    return rng.choice([
        "root ::= s\ns ::= s s | [a-z ]",
        'root ::= x+\nx ::= x x | "a" | "aa" | [a-z]+',
        'root ::= (a | b)*\na ::= "x" | a a\nb ::= "x" b | ""',
    ])  # fmt: skip


def small_gbnf(rng: random.Random) -> str:
    words = rng.sample(["yes", "no", "maybe", "42", "ok"], 3)
    return rng.choice([
        "root ::= " + " | ".join(f'"{w}"' for w in words),
        'root ::= [0-9]+ ("." [0-9]+)?',
        "root ::= missing",  # undefined rule
        'root ::= "unterminated',
        "root ::= [z-a]",  # an empty range
    ])  # fmt: skip


SCHEMAS = {
    "ref_chain": lambda rng: chain_schema(rng.choice([5, 100, 600, 1500])),
    "ref_cycle": ref_cycle,
    "wide": wide,
    "long_name": long_name,
    "nested": nested,
}
GRAMMARS = {"many_rules": many_rules, "ambiguous": ambiguous, "small_gbnf": small_gbnf}


def request_for(rng: random.Random) -> tuple[str, str, dict[str, Any]]:
    """(generator name, path, body) of one case."""
    if rng.random() < 0.35:
        name = rng.choice(sorted(GRAMMARS))
        return name, "/completion", {**PROMPT, "grammar": GRAMMARS[name](rng)}
    name = rng.choice(sorted(SCHEMAS))
    schema = SCHEMAS[name](rng)
    via = rng.choice(["json_schema", "response_format", "tool"])
    if via == "json_schema":
        return name, "/completion", {**PROMPT, "json_schema": schema}
    if via == "response_format":
        response_format = {"type": "json_schema", "json_schema": {"name": "fuzz", "schema": schema}}
        return name, "/v1/chat/completions", {**CHAT, "response_format": response_format}
    parameters = json.loads(json.dumps(schema).replace('"#/$defs/', '"#/properties/arguments/$defs/'))
    if parameters.get("type", "object") != "object":
        parameters = {"type": "object", "properties": {"value": parameters}}  # parameters are an object's schema
    tools = [{"type": "function", "function": {"name": "fuzz", "parameters": parameters}}]
    return name, "/v1/chat/completions", {**CHAT, "tools": tools, "tool_choice": "required"}


@pytest.mark.slow
def test_generated_grammars_never_5xx_nor_stall_the_server(tmp_path) -> None:
    rng = random.Random(SEED)
    counts: Counter[str] = Counter()
    problems: list[str] = []
    started = time.perf_counter()
    with serve(tmp_path, "--profile", "target-only", env=LIMITS) as server:
        with HealthCanary(server.url) as canary, httpx.Client(base_url=server.url, timeout=60) as http:
            for case in range(CASES):
                name, path, body = request_for(rng)
                response = http.post(path, json=body)
                counts[str(response.status_code)] += 1
                counts[f"{name}:{response.status_code}"] += 1
                if response.status_code >= 500 or envelope_problem(response):
                    problems.append(f"case {case} ({name} via {path}): {response.status_code} {response.text[:200]}")
        alive = server.process.poll() is None
    summary = {"cases": CASES, **dict(sorted(counts.items())), "slowest_health_s": round(canary.slowest, 3)}
    print(f"grammar-fuzz: {json.dumps(summary)} in {time.perf_counter() - started:.1f} s")
    assert not problems, problems
    assert alive, "the server died"
    assert canary.slowest < 1.0, f"/health took {canary.slowest:.2f} s"
    assert counts["200"] and counts["400"], counts  # the mix reaches both answers
