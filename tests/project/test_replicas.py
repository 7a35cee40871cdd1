"""Three replicas of one profile behind real nginx running ops/deploy/nginx.conf (ops/bench/nginx.py):
traffic spreads and each replica's /metrics add up to the requests sent, streams pass unbuffered,
an affinity key keeps a prefix on one replica's prompt cache, and a replica killed mid-run loses
no completed request while the stream it was serving ends with an error the client sees."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from ops.bench.nginx import fronted
from tests.support.server import RunningServer, serve

pytestmark = pytest.mark.slow  # three servers and nginx of its own

PROFILE = "target-only"  # the cheapest replica to start: no drafter to load
TOKENS = 8
REPLICAS = 3  # as many as ops/deploy/nginx.conf lists


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RunningServer]]:
    """Started at once, so their loads overlap. The last test of this file kills one."""
    with ExitStack() as stack:
        starting = [serve(tmp_path_factory.mktemp("replica"), "--profile", PROFILE) for _ in range(REPLICAS)]
        with ThreadPoolExecutor(REPLICAS) as pool:
            started = list(pool.map(stack.enter_context, starting))
        yield started


@pytest.fixture(scope="module")
def nginx_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("nginx")


@pytest.fixture(scope="module")
def balancer(replicas: list[RunningServer], nginx_dir: Path) -> Iterator[httpx.Client]:
    with (
        fronted([replica.url for replica in replicas], nginx_dir) as url,
        httpx.Client(base_url=url, timeout=httpx.Timeout(30)) as client,
    ):
        yield client


def counters(replica: RunningServer) -> dict[str, float]:
    text = httpx.get(f"{replica.url}/metrics", timeout=10).text
    return {name: float(value) for name, value in re.findall(r"^llamacpp:(\w+) (\S+)$", text, re.M)}


def requests_served(before: dict[str, float], after: dict[str, float]) -> int:
    """Every request looks in the prompt cache once: a hit or a miss."""
    looked = ("prompt_cache_hits_total", "prompt_cache_misses_total")
    return round(sum(after[name] - before[name] for name in looked))


def rows_running(replica: RunningServer) -> int:
    return sum(slot["is_processing"] for slot in httpx.get(f"{replica.url}/slots", timeout=10).json())


def complete(client: httpx.Client, prompt: str, tokens: int = TOKENS, **headers: str) -> dict:
    body = {"prompt": prompt, "n_predict": tokens, "ignore_eos": True, "temperature": 0}
    response = client.post("/completion", json=body, headers=headers)
    assert response.status_code == 200, response.text
    assert response.json()["tokens_predicted"] == tokens
    return response.json()


def test_traffic_spreads_and_metrics_add_up(replicas: list[RunningServer], balancer: httpx.Client) -> None:
    before = [counters(replica) for replica in replicas]
    for i in range(6):
        complete(balancer, f"def f{i}(x):")
    chat = {"messages": [{"role": "user", "content": "Add two numbers."}], "max_tokens": TOKENS, "ignore_eos": True}
    assert balancer.post("/v1/chat/completions", json=chat).json()["usage"]["completion_tokens"] == TOKENS
    stream_tokens, arrivals, started = 64, [], time.monotonic()
    body = {"prompt": "def g(x):", "n_predict": stream_tokens, "ignore_eos": True, "stream": True}
    with balancer.stream("POST", "/completion", json=body) as stream:
        arrivals = [time.monotonic() - started for line in stream.iter_lines() if line.startswith("data: ")]
    # unbuffered: the first frame reaches the client long before the last is decided
    assert arrivals[0] < arrivals[-1] / 2, arrivals
    after = [counters(replica) for replica in replicas]
    served = [requests_served(b, a) for b, a in zip(before, after, strict=True)]
    assert all(served) and sum(served) == 8, served
    predicted = sum(
        a["tokens_predicted_total"] - b["tokens_predicted_total"] for b, a in zip(before, after, strict=True)
    )
    assert predicted == 7 * TOKENS + stream_tokens


def test_prefix_key_keeps_a_prefix_on_one_replica(replicas: list[RunningServer], balancer: httpx.Client) -> None:
    system = "You answer questions about Python code, briefly and exactly. " * 30  # several 128-token chunks
    before = [counters(replica) for replica in replicas]
    cached = [
        complete(balancer, f"{system}Question {i}:", **{"X-Prefix-Key": "team-a"})["timings"]["cache_n"]
        for i in range(3)
    ]
    served = [requests_served(b, counters(replica)) for b, replica in zip(before, replicas, strict=True)]
    assert sorted(served) == [0, 0, 3], served
    assert cached[0] == 0 and min(cached[1:]) >= 128, cached


def test_a_public_host_name_reaches_replicas_that_refuse_it(
    replicas: list[RunningServer], balancer: httpx.Client
) -> None:
    """A loopback replica refuses a Host that is not a loopback name (DNS rebinding); nginx names it localhost."""
    public = {"Host": "mlxcel.example.com"}
    assert balancer.get("/props", headers=public).status_code == 200
    assert httpx.get(f"{replicas[0].url}/props", headers=public, timeout=10).status_code == 400


def test_killed_replica_loses_no_completed_request(
    replicas: list[RunningServer], balancer: httpx.Client, nginx_dir: Path
) -> None:
    body = {"prompt": "def long(x):", "n_predict": 2048, "ignore_eos": True, "stream": True}
    with balancer.stream("POST", "/completion", json=body) as stream, ThreadPoolExecutor(6) as pool:
        lines = stream.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        victim = next(replica for replica in replicas if rows_running(replica))
        # requests in flight while the replica dies: wait until one of them runs on it
        during = [pool.submit(complete, balancer, f"def during{i}(x):", 64) for i in range(6)]
        deadline = time.monotonic() + 10
        while rows_running(victim) < 2:
            assert time.monotonic() < deadline, "no request reached the replica to kill"
            time.sleep(0.02)
        victim.process.kill()
        with pytest.raises(httpx.RemoteProtocolError):  # a cut stream, never a hang (reads time out at 30 s)
            for _ in lines:
                pass
        results = [future.result() for future in during]
    after = [complete(balancer, f"def after{i}(x):") for i in range(6)]
    assert len(results) == 6 and len(after) == 6  # every one answered 200 with all its tokens
    # the one that ran on the victim was sent again to another replica
    assert "while reading response header from upstream" in (nginx_dir / "error.log").read_text()
