"""Many profiles behind one real server (`[router]`): each request's `model` reaches its profile,
loaded on first use within a memory budget, the least recently used unloaded to make room, while
the other models keep serving at their pace."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import httpx
import pytest
from litestar.testing import TestClient

from app.profiles import resolve, settled
from app.server.app import create_app
from app.server.engine_view import Engine
from ops.models.grown import quantized_copy
from tests.support.cli import write
from tests.support.server import RunningServer, serve

pytestmark = pytest.mark.slow

PROMPT = "def fibonacci(n):\n"
BODY = {"prompt": PROMPT, "n_predict": 24, "temperature": 0, "ignore_eos": True}
PACE_TOKENS = 100
# The embedded default (target 17.8 MB and drafter 4.2 MB on disk) and target-only (17.8 MB) fit
# 40 MB together; the 4-bit copy (5.0 MB) beside them does not: its load unloads one.
ROUTER = """
[router]
memory_budget_mb = 40
[[router.models]]
profile = "default"
[[router.models]]
name = "plain"
profile = "target-only"
aliases = ["target-only"]
[[router.models]]
name = "small"
profile = "small.toml"
"""
SMALL = 'target = "target-4bit"\n[drafter]\nkind = "none"\n'


@pytest.fixture(scope="module")
def profiles(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("router")
    quantized_copy(resolve("target-only").settings.target.model, root / "target-4bit")
    write(root, "small", SMALL)
    return write(root, "router", ROUTER)


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


def stream_gaps(client: httpx.Client, model: str, n: int, until: threading.Event | None = None) -> list[Gap]:
    """The gaps between the tokens of one streamed answer of `n` tokens, or until `until` is set
    (the stream is then closed: its row is cancelled)."""
    gaps, last = [], None
    with client.stream("POST", "/completion", json=BODY | {"model": model, "n_predict": n, "stream": True}) as response:
        for line in response.iter_lines():
            if until is not None and until.is_set():
                break
            if line.startswith("data: "):
                now = time.perf_counter()
                gaps += [] if last is None else [Gap(now, now - last)]
                last = now
    return gaps


class Gap(NamedTuple):
    at: float  # time.perf_counter() of the token that ended it
    seconds: float


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


def test_a_load_unloads_the_least_recently_used_while_another_model_keeps_its_pace(server: RunningServer) -> None:
    """While plain streams, small loads: the budget unloads default (the least recently used that
    no request holds), and plain's tokens keep coming at about their idle pace."""
    with server.client() as client:
        for model in ("default", "plain"):
            assert client.post("/completion", json=BODY | {"model": model, "n_predict": 1}).status_code == 200
        assert statuses(server) == {"default": "loaded", "plain": "loaded", "small": "unloaded"}
        idle = stream_gaps(client, "plain", PACE_TOKENS)
        loaded, load = threading.Event(), {}

        def load_small() -> None:
            time.sleep(0.2)  # plain streams before small's request comes
            load["started"] = time.perf_counter()
            try:
                body = BODY | {"model": "small", "n_predict": 1}
                load["answer"] = httpx.post(f"{server.url}/completion", json=body, timeout=120)
            finally:
                load["seconds"] = time.perf_counter() - load["started"]
                loaded.set()

        loader = threading.Thread(target=load_small)
        loader.start()
        streamed = stream_gaps(client, "plain", 4096, until=loaded)
        loader.join()
    assert load["answer"].status_code == 200
    assert statuses(server) == {"default": "unloaded", "plain": "loaded", "small": "loaded"}
    idle_median = statistics.median(gap.seconds for gap in idle)
    during = [gap.seconds for gap in streamed if gap.at > load["started"]]
    ratio = statistics.median(during) / idle_median
    print(
        f"small's request waited {load['seconds']:.2f} s for its load; plain's inter-token gap: idle median "
        f"{idle_median * 1e3:.1f} ms, during the load {statistics.median(during) * 1e3:.1f} ms "
        f"(mean {statistics.mean(during) * 1e3:.1f} ms, longest {max(during) * 1e3:.0f} ms, {len(during)} gaps), "
        f"ratio of medians {ratio:.2f}"
    )
    # Not the 1.5x: on a 2-core machine the load's forwards take the other core and share
    # its memory and caches (1.07x to 2.11x measured, docs/deployment.md). A stream that waited for
    # the load would show one gap as long as the load, not a median within a few times its pace.
    assert ratio < 3.0


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
