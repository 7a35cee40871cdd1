"""compat/llama-server/b10621 against the live app."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import msgspec
import pytest

from app.engine.engine import Engine
from app.profiles import resolve
from app.server.app import create_app
from tests.support import ROOT
from tests.support.compat import MANIFEST, OLLAMA, RouteEntry, Speculative, claimed, concrete, load, routes
from tests.support.server import API_KEY, serve


def test_manifest_files_are_valid_and_canonical() -> None:
    pin = load("pin.json")
    for name in ["pin.json", *pin["files"]]:
        text = (MANIFEST / name).read_text()
        assert text == json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False) + "\n", name
    entries = routes()
    assert [e.id for e in entries] == sorted(e.id for e in entries)
    assert all(e.id == f"{e.method} {e.path}" for e in entries)
    assert len({e.id for e in entries}) == len(entries)
    for entry in entries:
        assert (entry.test is None) == (entry.state == "deferred"), entry.id
        assert (entry.served_as is not None) == (entry.state == "aliased"), entry.id
        assert entry.state != "not_applicable" or entry.error is not None, entry.id
        assert entry.requires is None or (entry.state == "supported" and entry.error is not None), entry.id
        assert entry.requires_model is None or (entry.state == "supported" and entry.error is not None), entry.id
    spec = msgspec.convert(load("speculative.json"), Speculative).entries
    assert [(e.kind, e.id) for e in spec] == sorted((e.kind, e.id) for e in spec)
    counted = pin["counted"]
    states: dict[str, int] = {}
    for entry in entries:
        states[entry.state] = states.get(entry.state, 0) + 1
    assert counted["routes"] == len(entries) and counted["routes_by_state"] == states
    assert counted["speculative_entries"] == len(spec)
    timings = load("timings.json")
    assert timings["draft_block"] == ["draft_n", "draft_n_accepted", "draft_rounds", "draft_kind"]
    assert len(timings["base_keys"]) == 9


def test_the_ollama_manifest_is_valid_and_canonical() -> None:
    pin = load("pin.json", OLLAMA)
    for name in ["pin.json", *pin["files"]]:
        text = (OLLAMA / name).read_text()
        assert text == json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False) + "\n", name
    entries = routes(OLLAMA)
    assert [e.id for e in entries] == sorted(e.id for e in entries) and all(e.path.startswith(("/api/", "/v1/", "/"))
                                                                           for e in entries)  # fmt: skip
    states: dict[str, int] = {}
    for entry in entries:
        states[entry.state] = states.get(entry.state, 0) + 1
        assert (entry.served_as is not None) == (entry.state == "aliased"), entry.id
        assert entry.state != "not_applicable" or entry.error is not None, entry.id
    assert pin["counted"]["routes"] == len(entries) and pin["counted"]["routes_by_state"] == states


def all_tests() -> list[str]:
    refs = [e.test for e in routes() if e.test] + [e.test for e in routes(OLLAMA) if e.test]
    refs += [e["test"] for e in load("speculative.json")["entries"] if e.get("test")]
    refs += [d["test"] for d in load("timings.json")["divergences"]]
    return refs


@pytest.mark.parametrize("ref", sorted(set(all_tests())))
def test_every_named_test_exists(ref: str) -> None:
    file, _, name = ref.partition("::")
    path = ROOT / file
    assert path.is_file(), ref
    assert re.search(rf"^def {re.escape(name)}\(", path.read_text(), re.M), ref


def test_every_route_the_app_serves_is_claimed() -> None:
    app = create_app(Engine(resolve("default").settings))
    ids = {e.id for e in [*routes(), *routes(OLLAMA)] if e.state != "deferred"}
    served = set()
    for route in app.routes:
        path = re.sub(r"\{(\w+):\w+\}", r":\1", route.path)
        for method in route.methods - {"HEAD", "OPTIONS"}:
            served.add(f"{method} {path}")
    assert served - ids == set(), "served but not claimed"
    assert {e.id for e in claimed({"supported", "aliased"})} <= served
    ollama = routes(OLLAMA)
    assert {e.id for e in ollama if e.state == "supported"} | {e.served_as for e in ollama if e.served_as} <= served


def request_for(entry: RouteEntry) -> dict:
    bodies = {
        "/tokenize": {"content": "x"},
        "/detokenize": {"tokens": [1]},
        "/apply-template": {"messages": [{"role": "user", "content": "hi"}]},
        "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        "/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        "/v1/messages": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        "/v1/messages/count_tokens": {"messages": [{"role": "user", "content": "hi"}]},
        "/v1/chat/completions/input_tokens": {"messages": [{"role": "user", "content": "hi"}]},
        "/chat/completions/input_tokens": {"messages": [{"role": "user", "content": "hi"}]},
        "/v1/responses/input_tokens": {"input": "hi"},
        "/responses/input_tokens": {"input": "hi"},
        "/v1/responses": {"input": "hi", "max_output_tokens": 2},
        "/responses": {"input": "hi", "max_output_tokens": 2},
        "/v1/embeddings": {"input": "hi"},
        "/embeddings": {"input": "hi"},
        "/embedding": {"content": "hi"},
    }
    return {"json": bodies.get(entry.path, {"prompt": "x", "n_predict": 2})} if entry.method == "POST" else {}


@pytest.mark.parametrize(
    "entry",
    [e for e in claimed({"supported", "aliased"}) if e.requires is None and e.requires_model is None],
    ids=lambda e: e.id,
)
def test_supported_and_aliased_routes_resolve(default_server, entry: RouteEntry) -> None:
    with default_server.client() as http:
        response = http.request(entry.method, concrete(entry.path), **request_for(entry))
    assert response.status_code < 400, response.text


@pytest.mark.slow
def test_routes_a_profile_key_turns_on_resolve_with_it(tmp_path: Path) -> None:
    """Supported routes that need a profile key (`requires`: embeddings) answer on a server that has it."""
    needing = [e for e in claimed({"supported"}) if e.requires is not None]
    assert needing
    for requires in {tuple(sorted(e.requires.items())) for e in needing}:
        with serve(tmp_path, "--profile", "default", env=dict(requires)) as server, server.client() as http:
            for entry in (e for e in needing if tuple(sorted(e.requires.items())) == requires):
                response = http.request(entry.method, concrete(entry.path), **request_for(entry))
                assert response.status_code < 400, (entry.id, response.text)


OLLAMA_BODIES = {
    "/api/chat": {"model": "target", "messages": [{"role": "user", "content": "hi"}], "options": {"num_predict": 2}},
    "/api/generate": {"model": "target", "prompt": "hi", "options": {"num_predict": 2}},
    "/api/show": {"model": "target"},
}


@pytest.mark.parametrize(
    "entry", [e for e in routes(OLLAMA) if e.state == "supported" and e.requires is None], ids=lambda e: e.id
)
def test_ollama_supported_routes_resolve(default_server, entry: RouteEntry) -> None:
    body = {"json": OLLAMA_BODIES[entry.path]} if entry.method == "POST" else {}
    with default_server.client() as http:
        response = http.request(entry.method, concrete(entry.path), **body)
    assert response.status_code < 400, response.text


@pytest.mark.parametrize("entry", [e for e in routes(OLLAMA) if e.error], ids=lambda e: e.id)
def test_ollama_documented_errors(default_server, entry: RouteEntry) -> None:
    """Ollama's routes answer their errors in Ollama's shape, `{"error": "..."}`."""
    with default_server.client() as http:
        response = http.request(entry.method, concrete(entry.path), json={} if entry.method != "HEAD" else None)
    assert response.status_code == entry.error.status
    if entry.method != "HEAD":
        assert list(response.json()) == ["error"] and isinstance(response.json()["error"], str)


@pytest.mark.parametrize("entry", [e for e in routes() if e.error], ids=lambda e: e.id)
def test_documented_errors(default_server, entry: RouteEntry) -> None:
    with default_server.client() as http:
        response = http.request(entry.method, concrete(entry.path), json={})
    assert response.status_code == entry.error.status
    assert response.json()["error"] == {
        "code": entry.error.status,
        "message": response.json()["error"]["message"],
        "type": entry.error.type,
    }


def test_props_reports_the_profile_and_drafter(default_server) -> None:
    props = default_server.client().get("/props").json()
    assert props["total_slots"] == 8 and props["model_path"] == "target"  # its name: server.props_show_paths is off
    assert props["build_info"].startswith("mlxcel ")
    assert props["default_generation_settings"]["speculative.n_max"] == 4
    params = props["default_generation_settings"]["params"]  # llama-server's place for the defaults
    assert (params["temperature"], params["top_k"], params["n_predict"], params["seed"]) == (0.8, 40, -1, -1)
    assert params["speculative.n_max"] == 4 and params["logit_bias"] == []
    assert props["mlxcel"]["drafter"] == {"kind": "draft-model", "model": props["mlxcel"]["drafter"]["model"],
                                          "width": 4, "p_min": 0.0}  # fmt: skip


def test_apply_template(default_server) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}]}
    prompt = default_server.client().post("/apply-template", json=body).json()["prompt"]
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def scrape(http: httpx.Client) -> dict[str, float]:
    values = {}
    for line in http.get("/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def test_metrics_move_by_exactly_the_draft_block_totals(default_server) -> None:
    default_server.wait_idle()
    with default_server.client() as http:
        before = scrape(http)
        keys = ("draft_rounds", "draft_n", "draft_n_accepted", "prompt_n", "predicted_n")
        totals = dict.fromkeys(keys, 0)
        for i, prompt in enumerate(["def f(x):\n", "class A:\n", "import os\n"]):
            t = http.post("/completion", json={"prompt": prompt, "n_predict": 30 + i, "temperature": 0}).json()[
                "timings"
            ]
            totals = {key: totals[key] + t[key] for key in keys}
        # ignore_eos: this unseeded sampled request must decode all 5 tokens, never stop at EOS early
        http.post("/completion", json={"prompt": "x", "n_predict": 5, "speculative.n_max": 0, "ignore_eos": True})
        after = scrape(http)

    def delta(name: str) -> float:
        return after.get(f"llamacpp:{name}", 0) - before.get(f"llamacpp:{name}", 0)

    assert delta("spec_decode_num_drafts_total") == totals["draft_rounds"]
    assert delta("spec_decode_num_draft_tokens_total") == totals["draft_n"]
    assert delta("spec_decode_num_accepted_tokens_total") == totals["draft_n_accepted"]
    per_position = sum(v - before.get(k, 0) for k, v in after.items() if "accepted_tokens_per_pos_total" in k)
    assert per_position == totals["draft_n_accepted"]
    assert delta("prompt_tokens_total") == totals["prompt_n"] + 1
    assert delta("tokens_predicted_total") == totals["predicted_n"] + 5


def test_speculative_p_min_shortens_chains(default_server) -> None:
    request = {"prompt": "def area(radius):\n", "n_predict": 40, "temperature": 0}
    with default_server.client() as http:
        plain = http.post("/completion", json=request).json()
        cautious = http.post("/completion", json={**request, "speculative.p_min": 0.99}).json()
    assert cautious["content"] == plain["content"]
    assert cautious["timings"].get("draft_n", 0) < plain["timings"]["draft_n"]


@pytest.mark.slow
def test_the_api_key_gates_every_claimed_route(keyed_server) -> None:
    # Every route the app serves (unserved ones answer 404 whoever asks), the public ones excepted:
    # health, the models and the schema (tests/server/test_http_surface.py).
    served = [e for e in routes() if e.state != "deferred" and not (e.error and e.error.status == 404)]
    public = ("/", "/favicon.ico", "/health", "/v1/health", "/models", "/v1/models", "/v1/models/:model_id")  # the page
    gated = [e for e in served if e.path not in public and not e.path.startswith("/schema")]
    with keyed_server.client() as http:
        for entry in gated:
            path = concrete(entry.path)
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
                refused = http.request(entry.method, path, headers=headers, **request_for(entry))
                assert refused.status_code == 401, entry.id
                assert refused.json()["error"]["type"] == "authentication_error"
            allowed = http.request(
                entry.method, path, headers={"Authorization": f"Bearer {API_KEY}"}, **request_for(entry)
            )
            assert allowed.status_code != 401, entry.id
