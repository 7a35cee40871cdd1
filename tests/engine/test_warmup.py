"""The warm-up (`server.warmup`): the engine runs every batch size and draft width once before it
turns ready, says so in two events, and leaves no trace in what requests see (prompt cache,
metrics). On the CPU `auto` skips it: nothing there compiles on first use."""

from __future__ import annotations

import msgspec
import pytest
from structlog.testing import capture_logs

from app.engine.engine import Engine, EngineState
from app.execution.device import backend
from app.profiles import resolve


def started(profile: str, warmup: str) -> tuple[Engine, list[dict], list[str]]:
    """An engine of `profile` with `server.warmup`, run until ready; its events, and the events
    seen by the time it turned ready."""
    settings = resolve(profile).settings
    settings = msgspec.structs.replace(settings, server=msgspec.structs.replace(settings.server, warmup=warmup))
    at_ready: list[str] = []
    with capture_logs() as logs:
        engine = Engine(settings, on_ready=lambda _: at_ready.extend(e["event"] for e in logs))
        engine.start()
        assert engine.wait_ready(timeout=300)
    return engine, logs, at_ready


@pytest.mark.parametrize("profile", ["default", "mtp"])
def test_the_warm_up_runs_every_batch_size_and_width_before_ready(profile: str) -> None:
    engine, logs, at_ready = started(profile, "on")
    try:
        warming = next(e for e in logs if e["event"] == "model_warming")
        warmed = next(e for e in logs if e["event"] == "model_warmed")
        max_rows = engine.settings.server.max_rows
        assert warming["batch_sizes"] == [1, 2, 4, 8][: warming["batch_sizes"].index(max_rows) + 1]
        assert warming["widths"][0] > 0 and warming["widths"][-1] == 0  # every width down to target-only
        assert warmed["rows"] == sum(warming["batch_sizes"]) and warmed["seconds"] > 0
        assert "model_warmed" in at_ready  # before /health could answer 200
        snapshot = engine.snapshot()
        assert snapshot.state is EngineState.READY and snapshot.rows == ()
        metrics = snapshot.metrics
        assert metrics.tokens_predicted_total == metrics.prompt_tokens_total == 0  # warm rows are nobody's requests
        assert metrics.spec_decode_num_drafts_total == 0
        counters = engine.host.prompt_cache_counters
        assert counters is None or counters.hits + counters.misses + counters.bytes == 0  # nor their prompts
    finally:
        engine.stop()


@pytest.mark.skipif(backend().gpu, reason="on a GPU auto warms")
def test_auto_does_not_warm_on_the_cpu() -> None:
    engine, logs, _ = started("target-only", "auto")
    engine.stop()
    assert not [e for e in logs if e["event"].startswith("model_warm")]
