"""The engine's tick weighs the load: with many rows (greedy and seeded sampler-match) on a forward
whose positions cost, the tick's choice narrows their widths (one `speculation_width_changed`
line per row and change) and every row still emits its solo tokens."""

from __future__ import annotations

import io
import json
import queue
from collections.abc import Iterator

import mlx.nn as nn
import pytest

from app.decoding.builder import RowRequest
from app.decoding.row_events import Finished
from app.engine.engine import Engine
from app.engine.row import Job
from app.execution.cost import TARGET_ROWS, PlaneCost, plane_of
from app.profiles import resolve
from app.sampling import SamplingParams

PROMPTS = ["def rolling_mean(values, window):\n", "class Stack:\n", "import os\n", "def area(radius):\n"]
GREEDY = SamplingParams(temperature=0.0)
HOT = SamplingParams(temperature=0.7)


@pytest.fixture
def engine(log: io.StringIO) -> Iterator[Engine]:
    engine = Engine(resolve("default").settings)
    engine.start()
    assert engine.wait_ready(120)
    yield engine
    engine.stop()


def positions_dominate() -> PlaneCost:
    """Forwards whose cost grows with their positions (a row more costing no more than a wider one)."""
    cost = plane_of(nn.Linear(1, 1), TARGET_ROWS)
    for rows, positions in ((8, 8), (8, 40), (4, 12), (2, 10), (1, 1)):
        cost.observe((rows, positions), 0.001 + 0.001 * positions)
    return cost


def finish(engine: Engine, requests: list[RowRequest]) -> list[Finished]:
    """Submit every request at once; their results in order."""
    inboxes: list[queue.Queue] = []
    for i, request in enumerate(requests):
        inboxes.append(queue.Queue())
        engine.submit(Job(request=request, request_id=f"goodput-{id(requests)}-{i}", route="test",
                          sink=inboxes[-1].put))  # fmt: skip
    results = []
    for inbox in inboxes:
        while not isinstance(event := inbox.get(timeout=120), Finished):
            pass
        results.append(event)
    return results


def test_narrowed_rows_keep_their_solo_tokens(engine: Engine, log: io.StringIO) -> None:
    encode = engine.host.target.tokenizer.encode
    requests = [RowRequest(encode(p), GREEDY, max_tokens=32, ignore_eos=True) for p in PROMPTS]
    requests += [RowRequest(encode(p), HOT, max_tokens=32, seed=7 + i, ignore_eos=True) for i, p in enumerate(PROMPTS)]
    solo = [finish(engine, [request])[0] for request in requests]
    engine.scheduler.goodput.target = positions_dominate  # the measured costs, made position-bound
    start = len(log.getvalue())
    together = finish(engine, requests)
    assert [r.tokens for r in together] == [r.tokens for r in solo]
    lines = [json.loads(line) for line in log.getvalue()[start:].splitlines() if line.startswith("{")]
    changes = [e for e in lines if e["event"] == "speculation_width_changed"]
    assert changes and all(e["request_id"].startswith("goodput-") for e in changes)
    # the last row left decoding is chosen alone (batch 1), as a lone drafting row is
    first = next(e for e in changes if e["batch"] >= 2)
    assert first["cap"] < 4 and first["previous"] is None and first["expected_gain"] > 1.02
    assert set(first["prices"]) == {"target", "host", "drafter_chain"} and len(first["prices"]["target"]) == 3
    assert len({e["request_id"] for e in changes}) >= 2  # each row's own line
    # the timings show the narrowing: the same requests proposed fewer drafts together, on the
    # position-bound costs, than each alone before them
    assert sum(r.timings.draft_n or 0 for r in together) < sum(r.timings.draft_n or 0 for r in solo)
