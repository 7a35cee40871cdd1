"""The opt-in fast path (`execution.exact = false`): the same pool and ticks through MLX's own kernels.

Its rows still batch, and compute what the exact path computes within rounding; what it gives up
is the guarantee that a row's bits are its solo forward's. The server says so (`/props`,
`timings`, the startup event).
"""

from __future__ import annotations

import json

import httpx
import mlx.core as mx
import numpy as np
import pytest

from app.execution.attention import Attending
from app.execution.forward import RowForward, batching, forward
from app.execution.model import load_model
from app.execution.prepare import prepared
from app.execution.runner import ModelRunner
from app.loading import EMBEDDED_TARGET
from tests.support.server import serve


def test_the_fast_path_batches_through_mlx_kernels_within_rounding_of_the_exact_one() -> None:
    exact, fast = load_model(EMBEDDED_TARGET).model, load_model(EMBEDDED_TARGET, exact=False).model
    assert prepared(fast).attending is Attending.STOCK and prepared(exact).attending is not Attending.STOCK
    assert batching(fast) == "rows"
    rng = np.random.default_rng(2)
    prompts = [rng.integers(4, 4000, size=n).tolist() for n in (7, 60, 33)]
    rows = {}
    for name, model in (("exact", exact), ("fast", fast)):
        runners = [ModelRunner(model) for _ in prompts]
        for runner, prompt in zip(runners, prompts, strict=True):
            mx.eval(runner.prefill(prompt))
        rows[name] = forward([RowForward(r, [5, 6, 7][: 1 + i]) for i, r in enumerate(runners)])
        mx.eval(rows[name])
    tolerance = 1e-3 if rows["exact"][0].dtype == mx.float32 else 0.5  # the GPU keeps bf16
    for a, b in zip(rows["exact"], rows["fast"], strict=True):
        assert mx.allclose(a.astype(mx.float32), b.astype(mx.float32), atol=tolerance, rtol=tolerance).item()


@pytest.mark.slow
def test_a_fast_path_server_says_it_is_not_exact(tmp_path) -> None:
    with serve(tmp_path, "--profile", "target-only", env={"MLXCEL_EXECUTION__EXACT": "false"}) as server:
        props = httpx.get(f"{server.url}/props", timeout=30).json()
        body = {"prompt": "def add(a, b):", "n_predict": 8, "temperature": 0}
        done = httpx.post(f"{server.url}/completion", json=body, timeout=120).json()
    assert props["mlxcel"]["exact"] is False
    assert done["timings"]["exact"] is False and done["timings"]["predicted_n"] == 8
    events = [json.loads(line) for line in server.log.read_text().splitlines()]
    ready = next(e for e in events if e["event"] == "acceptance_rule_active")
    assert ready["exact"] is False and ready["batching"] == "rows"
