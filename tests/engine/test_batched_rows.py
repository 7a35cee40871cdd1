"""Mixed concurrent requests share the engine's batched ticks yet each gets its solo output,
its own timings, its own events, and /metrics moves by exactly the rows' totals."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.support.server import serve, sse_frames

COUNTS = ("prompt_n", "predicted_n", "draft_rounds", "draft_n", "draft_n_accepted")
SAMPLED = {"temperature": 0.7}
REQUESTS = [
    {"prompt": "def rolling_mean(values, window):\n", "n_predict": 40, "temperature": 0},
    {"prompt": "class Stack:\n    def __init__(self):\n", "n_predict": 56, **SAMPLED, "seed": 11},
    {"prompt": "import os\n\n\ndef walk(root):\n", "n_predict": 30, **SAMPLED, "seed": 12, "speculative.n_max": 0},
    {"prompt": "for item in items:\n", "n_predict": 48, "temperature": 0, "stop": ["- ''\n#"]},
    {"prompt": "def parse(text):\n    tokens = []\n", "n_predict": 24, **SAMPLED, "seed": 13, "speculative.n_max": 2},
    {"prompt": "def area(radius):\n", "n_predict": 36, **SAMPLED, "seed": 14, "repeat_penalty": 1.3},
    {"prompt": "def retry(times):\n", "n_predict": 20, "temperature": 0, "speculative.n_max": 0},
    {"prompt": "class Config:\n    def load(self, path):\n", "n_predict": 44, **SAMPLED, "seed": 15,
     "timings_per_token": True},
]  # fmt: skip


def completion(url: str, request: dict) -> dict:
    """The streamed text, the final frame's stop and timing counts, and the request id (the prompt
    cache off: the solo run would leave the batched one its prompts, and prompt_n would differ)."""
    body = {**request, "stream": True, "ignore_eos": True, "cache_prompt": False}
    with httpx.Client(base_url=url, timeout=120) as http, http.stream("POST", "/completion", json=body) as r:
        frames = sse_frames(r)
        rid = r.headers["x-request-id"]
    final = frames[-1]
    if request.get("timings_per_token"):
        assert all("timings" in f for f in frames)
    return {
        "content": "".join(f["content"] for f in frames),
        "stop_type": final["stop_type"],
        "counts": {key: final["timings"].get(key) for key in COUNTS},
        "id": rid,
    }


def cancel_mid_stream(url: str) -> str:
    """A long request whose client leaves after three frames."""
    body = {"prompt": "def walk(tree):\n", "n_predict": 3000, "ignore_eos": True, "stream": True, "temperature": 0}
    with httpx.Client(base_url=url, timeout=120) as http, http.stream("POST", "/completion", json=body) as r:
        frames = (line for line in r.iter_lines() if line.startswith("data: "))
        for _ in range(3):
            next(frames)
        return r.headers["x-request-id"]


def comparable(result: dict) -> dict:
    """What must not depend on a row's batch-mates: everything, but its draft counts, which follow
    the widths the tick's choice made for it (app/decoding/goodput.py `Goodput`: under the default
    profile's rules, greedy argmax and sampler-match, every width emits the same tokens)."""
    kept = {k: v for k, v in result.items() if k != "id"}
    kept["counts"] = {k: v for k, v in kept["counts"].items() if not k.startswith("draft_")}
    return kept


def scrape(http: httpx.Client) -> dict[str, float]:
    lines = [line.rsplit(" ", 1) for line in http.get("/metrics").text.splitlines() if line and line[0] != "#"]
    return {name: float(value) for name, value in lines}


def test_mixed_concurrent_requests_each_get_their_solo_output_and_counts(default_server) -> None:
    url = default_server.url
    solo = [completion(url, request) for request in REQUESTS]
    assert any(result["stop_type"] == "word" for result in solo)
    with default_server.client() as http:
        before = scrape(http)
        with ThreadPoolExecutor(len(REQUESTS) + 1) as pool:
            cancelled = pool.submit(cancel_mid_stream, url)
            together = list(pool.map(lambda request: completion(url, request), REQUESTS))
        after = scrape(http)
    for request, one, many in zip(REQUESTS, solo, together, strict=True):
        assert comparable(many) == comparable(one), request
        if many["counts"]["draft_rounds"]:
            event = default_server.wait_for_event("speculative_request", many["id"])
            assert (event["rounds"], event["predicted_n"]) == (
                many["counts"]["draft_rounds"],
                many["counts"]["predicted_n"],
            )
    assert default_server.wait_for_event("request_cancelled", cancelled.result())["decided"] < 3000

    def moved(name: str) -> float:
        return after.get(f"llamacpp:{name}", 0) - before.get(f"llamacpp:{name}", 0)

    totals = {key: sum(result["counts"][key] or 0 for result in together) for key in COUNTS}
    assert moved("tokens_predicted_total") == totals["predicted_n"]
    assert moved("prompt_tokens_total") == totals["prompt_n"]
    assert moved("spec_decode_num_drafts_total") == totals["draft_rounds"]
    assert moved("spec_decode_num_draft_tokens_total") == totals["draft_n"]
    assert moved("spec_decode_num_accepted_tokens_total") == totals["draft_n_accepted"]


@pytest.mark.slow
def test_a_one_token_budget_advances_one_row_per_tick_and_starves_none(tmp_path: Path) -> None:
    """Every row is over budget but the first each tick: the leftovers go first next tick."""
    requests = REQUESTS[:5]
    with serve(tmp_path, "--profile", "default", env={"MLXCEL_SERVER__MAX_BATCH_TOKENS": "1"}) as server:
        with ThreadPoolExecutor(len(requests)) as pool:
            together = list(pool.map(lambda request: completion(server.url, request), requests))
        solo = [completion(server.url, request) for request in requests]
    assert [comparable(r) for r in together] == [comparable(r) for r in solo]
