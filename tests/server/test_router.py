"""Many profiles behind one real server (`[router]`): each request's `model` reaches its profile,
loaded on first use within a memory budget, the least recently used unloaded to make room, while
the other models keep serving at their pace."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from litestar.testing import TestClient

from app.profiles import resolve, settled
from app.server.app import create_app
from app.server.engine_view import Engine
from ops.bench.router_pace import BODY, load_models, pace_during_load, write_profiles
from tests.support.server import RunningServer, serve

pytestmark = pytest.mark.slow

PACE_TOKENS = 100


@pytest.fixture(scope="module")
def profiles(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_profiles(tmp_path_factory.mktemp("router"))


@pytest.fixture(scope="module")
def server(profiles: Path) -> Iterator[RunningServer]:
    with serve(profiles.parent, "--profile", str(profiles)) as running:
        yield running


def statuses(server: RunningServer) -> dict[str, str]:
    return {m["id"]: m["status"]["value"] for m in httpx.get(f"{server.url}/v1/models").json()["data"]}


def alone(profile: str | Path, body: dict) -> str:
    """The profile's answer from an app of its own (in process: its engine behind the same routes)."""
    with TestClient(create_app(Engine(settled(resolve(str(profile))).settings)), timeout=60) as client:
        deadline = time.monotonic() + 60
        while client.get("/health").status_code != 200:
            assert time.monotonic() < deadline, "the reference engine did not load"
            time.sleep(0.02)
        return client.post("/completion", json=body).json()["content"]


def test_listing_and_unknown_model(server: RunningServer) -> None:
    models = httpx.get(f"{server.url}/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["default", "plain", "small"]
    assert all(m["status"]["value"] in ("loaded", "unloaded") for m in models["data"])
    assert [m["name"] for m in httpx.get(f"{server.url}/api/tags").json()["models"]] == ["default", "plain", "small"]
    missing = httpx.post(f"{server.url}/v1/chat/completions", json={"model": "gpt-4", "messages": []})
    assert missing.status_code == 404
    error = missing.json()["error"]
    assert error["type"] == "not_found_error"
    assert error["message"] == "model 'gpt-4' not found; this server serves 'default', 'plain', 'small'"


def test_a_load_unloads_the_least_recently_used_while_another_model_keeps_serving(server: RunningServer) -> None:
    """While plain streams, small loads: the budget unloads default (the least recently used that
    no request holds), and plain's tokens keep coming all through the load. Its pace against idle
    is a measurement, not a test's bound: `python -m ops.bench.router_pace` (docs/benchmarks.md)."""
    assert load_models(server.url, ("default", "plain")) == [200, 200]
    assert statuses(server) == {"default": "loaded", "plain": "loaded", "small": "unloaded"}
    pace = pace_during_load(server.url, "plain", "small", PACE_TOKENS)
    print(pace.summary())
    assert pace.status == 200
    assert statuses(server) == {"default": "unloaded", "plain": "loaded", "small": "loaded"}
    # A stream that waited for the load would have one gap spanning most of it (and few tokens in it).
    assert len(pace.during) >= 5 and max(pace.during) < pace.load_s / 2, pace.summary()


def test_each_model_answers_as_its_profile_alone(server: RunningServer, profiles: Path) -> None:
    """T = 0: byte-identical to the same profile served alone; the model named by name or alias."""
    with server.client() as client:
        for model, profile in [("default", "default"), ("target-only", "target-only"), ("small", "small")]:
            answer = client.post("/completion", json=BODY | {"model": model}).json()
            path = profiles.parent / "small.toml" if profile == "small" else profile
            assert answer["content"] == alone(path, BODY), model
        assert client.post("/completion", json=BODY).json()["model"] == "default"  # no model: the first


def test_every_api_and_introspection_route_reaches_the_named_model(server: RunningServer) -> None:
    messages = [{"role": "user", "content": "hi"}]
    with server.client() as client:
        chat = client.post("/v1/chat/completions", json={"model": "small", "messages": messages, "max_tokens": 2})
        assert chat.json()["model"] == "small"
        anthropic = {"model": "plain", "messages": messages, "max_tokens": 2}
        assert client.post("/v1/messages", json=anthropic).json()["model"] == "plain"
        ollama = {"model": "default:latest", "messages": messages, "stream": False, "options": {"num_predict": 2}}
        assert client.post("/api/chat", json=ollama).json()["model"] == "default"
        assert client.get("/props", params={"model": "small"}).json()["model_path"] == "target-4bit"
        assert client.get("/slots", params={"model": "plain"}).status_code == 200
        metrics = client.get("/metrics").text
        loaded = [name for name, status in statuses(server).items() if status == "loaded"]
        assert all(f'llamacpp:tokens_predicted_total{{model="{name}"}}' in metrics for name in loaded)
        assert "gpt-4" not in metrics and 'model="default:latest"' not in metrics  # configured names only
