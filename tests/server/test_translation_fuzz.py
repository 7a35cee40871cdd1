"""Fuzz where the schema fuzz (test_fuzz.py) reaches least: the Responses and Messages translations
(their `input`, `messages`, `tools` and `tool_choice` are open JSON to the schema, so random cases
rarely build a function call or a tool_use block) and every float field at the edges of float32.

Bodies come from `random.Random(34)`: items, blocks, tools and choices of every kind; half the
cases clean, half spoiled (a field of the wrong type, left out, an unknown kind). Every answer
must be below 500 and an error in the envelope. Every float field (the request Structs' own
list) goes to /completion at values finite in 64 bits but not in 32, and at the sampler's edges:
a 400, or a 200 whose sampler probabilities (`post_sampling_probs`) are all numbers (a NaN row
encodes as null; before issue 34, 1e39 penalties made rows NaN).
"""

from __future__ import annotations

import json
import random
from typing import Any

import httpx
import pytest

from app.sampling.params import FLOAT_DOMAINS
from app.server.core.schemas import _float_fields
from app.server.native.requests import CompletionRequest
from ops.bench.hostile import envelope_problem

CASES = 120  # per API
SEED = 34
EXTREMES = (1e39, -1e39, 3e38, -3e38, 1e-300, 1e20, -1e20)
# what makes a field's stage run at all (its value matters only then)
ACTIVATE: dict[str, dict[str, Any]] = {
    "dry_base": {"dry_multiplier": 0.8},
    "dry_multiplier": {"dry_base": 1.75},
    "xtc_threshold": {"xtc_probability": 1.0},
    "dynatemp_exponent": {"dynatemp_range": 0.5},
    "mirostat_tau": {"mirostat": 2},
    "mirostat_eta": {"mirostat": 2},
}
PROMPT = "a b a b a b a b"  # repeats, so that the penalties and DRY have something to act on


class Gen:
    """Random bodies: a case is clean (only values the API defines, every required field) or, one
    time in two, spoiled (a value of another type, a field left out, an unknown kind, now and then)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.spoil = 0.0

    def case(self, make: Any) -> dict[str, Any]:
        self.spoil = self.rng.choice([0.0, 0.15])
        return make(self)

    def pick(self, good: list[Any], bad: list[Any] | None = None) -> Any:
        """One of `good`, or of `bad` (and junk) when spoiling."""
        if self.rng.random() < self.spoil:
            return self.rng.choice([*(bad or []), None, 5, -1.5, "x", "", [], [1, "a"], {}, {"a": 1}, True])
        return self.rng.choice(good)

    def some(self, candidates: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
        """The `required` keys (each may be dropped when spoiling) and some of the others."""
        return {
            key: value
            for key, value in candidates.items()
            if (key in required and self.rng.random() >= self.spoil)
            or (key not in required and self.rng.random() < 0.5)
        }


def tool(g: Gen) -> Any:
    parameters = g.pick([{"type": "object"}, {"type": "object", "properties": {"x": {"type": "string"}}}], [[1]])
    function = g.some(
        {"name": g.pick(["f", "g", "get_weather"]), "parameters": parameters, "description": "d"}, ("name",)
    )
    return {"type": g.pick(["function"], ["web_search"])} | function


def response_item(g: Gen) -> Any:
    kind = g.pick(["message", "message", "function_call", "function_call_output"], ["reasoning"])
    if kind == "function_call":
        arguments = g.pick(['{"x": 1}', "{}"], ["[", "1"])
        body = g.some({"call_id": g.pick(["call_1"]), "name": g.pick(["f"]), "arguments": arguments},
                      ("call_id", "name"))  # fmt: skip
    elif kind == "function_call_output":
        output = g.pick(["ok", [{"type": "input_text", "text": "t"}]], [[{"type": "input_image"}]])
        body = g.some({"call_id": g.pick(["call_1"]), "output": output}, ("call_id", "output"))
    else:
        part = {"type": g.pick(["input_text", "output_text", "text"], ["input_image"]), "text": g.pick(["hi"])}
        content = g.pick(["hello", [part], [part, part]])
        body = g.some({"role": g.pick(["user", "assistant", "system", "developer"], ["tool"]), "content": content},
                      ("role", "content"))  # fmt: skip
    return {"type": kind} | body if isinstance(kind, str) else body


def responses_body(g: Gen) -> dict[str, Any]:
    items = [response_item(g) for _ in range(g.rng.randint(1, 4))] + [{"role": "user", "content": "hi"}]
    body: dict[str, Any] = {"model": "x", "max_output_tokens": 2, "input": g.pick([items, "hi"])}
    formats = [{"type": "json_object"}, {"type": "json_schema", "schema": {"type": "object"}}, {"type": "text"}]
    body |= g.some({
        "instructions": g.pick(["be brief"]),
        "tools": [tool(g) for _ in range(g.rng.randint(0, 3))],
        "tool_choice": g.pick(["auto", "none"], ["required", {"type": "function", "name": "f"}, {"type": "x"}]),
        "text": {"format": g.pick(formats, [{"type": "xml"}, {"type": "json_schema"}])},
        "temperature": g.pick([0.0, 0.7, 1.0], [1e39, -1.0]),
        "top_p": g.pick([0.5, 1.0, 0.9], [2.0]),
        "parallel_tool_calls": g.pick([True, False]),
        "previous_response_id": g.pick([None], ["resp_unknown"]),
        "store": g.pick([True, False]),
    })  # fmt: skip
    return body


def block(g: Gen, role: str) -> Any:
    kinds = ["text", "text", "tool_use", "thinking"] if role == "assistant" else ["text", "text", "tool_result"]
    kind = g.pick(kinds, ["image", "document"])
    fields = (
        {
            "text": {"text": g.pick(["hi"])},
            "tool_use": {"id": g.pick(["toolu_1"]), "name": g.pick(["f"]), "input": g.pick([{"x": 1}, {}])},
            "tool_result": {
                "tool_use_id": g.pick(["toolu_1"]),
                "content": g.pick(["ok", [{"type": "text", "text": "r"}]]),
            },
            "thinking": {"thinking": "hm"},
        }.get(kind, {})
        if isinstance(kind, str)
        else {}
    )
    return {"type": kind} | g.some(fields, tuple(fields))


def messages_body(g: Gen) -> dict[str, Any]:
    turns = []
    for index in range(g.rng.randint(0, 2) * 2 + 1):  # user first, user last
        role = g.pick(["user" if index % 2 == 0 else "assistant"], ["system"])
        content = g.pick(["hi", [block(g, role) for _ in range(g.rng.randint(1, 3))]])
        turns.append(g.some({"role": role, "content": content}, ("role", "content")))
    body: dict[str, Any] = {"model": "x", "max_tokens": 2, "messages": turns}
    anthropic_tool = g.some({"name": g.pick(["f"]), "input_schema": g.pick([{"type": "object"}], [[1]]),
                             "type": g.pick(["custom"], ["web_search_20250305"])}, ("name",))  # fmt: skip
    choice = g.some({"type": g.pick(["auto", "none"], ["any", "tool", "x"]), "name": g.pick(["f"]),
                     "disable_parallel_tool_use": g.pick([True, False])}, ("type",))  # fmt: skip
    body |= g.some({
        "system": g.pick(["be brief", [{"type": "text", "text": "s"}]]),
        "tools": [anthropic_tool for _ in range(g.rng.randint(0, 2))],
        "tool_choice": choice,
        "stop_sequences": g.pick([["\n"]]),
        "temperature": g.pick([0.0, 0.7, 1.0], [1e39, -1.0]),
        "top_p": g.pick([0.5, 1.0, 0.9], [2.0]),
        "top_k": g.pick([1, 40, 0], [-5]),
        "output_config": {"format": g.pick([{"type": "json_schema", "schema": {"type": "object"}}], [{"type": "x"}])},
        "mcp_servers": g.pick([[]], [[{}]]),
    })  # fmt: skip
    return body


def fuzzed(server_url: str, path: str, bodies: list[dict[str, Any]]) -> tuple[dict[int, int], list[str]]:
    statuses: dict[int, int] = {}
    found = []
    with httpx.Client(base_url=server_url, timeout=60) as http:
        for body in bodies:
            answer = http.post(path, json=body)
            statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1
            issue = f"{answer.status_code}: {answer.text[:160]}" if answer.status_code >= 500 else None
            issue = issue or envelope_problem(answer)
            if issue:
                found.append(f"{path}: {issue} <- {json.dumps(body)[:300]}")
    return statuses, found


@pytest.mark.slow
@pytest.mark.parametrize(("path", "make"), [("/v1/responses", responses_body), ("/v1/messages", messages_body)])
def test_translations_answer_every_malformed_body_below_500(target_only_server, path: str, make) -> None:
    generate = Gen(SEED)
    statuses, found = fuzzed(target_only_server.url, path, [generate.case(make) for _ in range(CASES)])
    print(f"translation-fuzz {path}: {json.dumps(statuses)}")
    assert found == [], "\n".join(found[:20])
    assert statuses.get(200, 0) > 10 and statuses.get(400, 0) > 10  # both sides of the translation were reached


def float_fields() -> list[str]:
    return [wire for _, wire in _float_fields(CompletionRequest)]


def test_the_float_fuzz_covers_every_float_field_and_domain() -> None:
    assert set(FLOAT_DOMAINS) | {"logit_bias", "speculative.p_min"} == set(float_fields())


@pytest.mark.slow
def test_every_float_field_at_the_edges_of_float32_is_refused_or_finite(target_only_server) -> None:
    found = []
    answered = {200: 0, 400: 0}
    with target_only_server.client() as http:
        for name in float_fields():
            for value in EXTREMES:
                setting = {"logit_bias": {"5": value}} if name == "logit_bias" else {name: value}
                body = {"prompt": PROMPT, "n_predict": 2, "n_probs": 2, "post_sampling_probs": True,
                        "temperature": 1.0, "seed": 1}  # fmt: skip
                answer = http.post("/completion", json=body | ACTIVATE.get(name, {}) | setting)
                answered[answer.status_code] = answered.get(answer.status_code, 0) + 1
                if answer.status_code == 200:
                    entries = answer.json()["completion_probabilities"]  # the sampler's own rows
                    probs = [p["prob"] for e in entries for p in [e, *e["top_probs"]]]
                    if not entries or any(not isinstance(p, float) for p in probs):
                        found.append(f"{name}={value}: a 200 whose sampler rows hold {probs[:3]}")
                elif answer.status_code != 400 or envelope_problem(answer):
                    found.append(f"{name}={value}: {answer.status_code} {answer.text[:160]}")
    print(f"float-fuzz: {json.dumps(answered)}")
    assert found == [], "\n".join(found)
