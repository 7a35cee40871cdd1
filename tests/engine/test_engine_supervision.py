"""The engine thread is supervised: a failing row fails alone, a broken loop fails loudly."""

from __future__ import annotations

import io
import json
import queue
import re
from collections.abc import Iterator

import pytest

from app.decoding.builder import RowRequest
from app.decoding.row_events import Event, Failed, Finished
from app.engine.engine import Engine, EngineState, UnavailableError
from app.engine.row import Job
from app.profiles import resolve
from app.sampling import SamplingParams
from app.sampling.rng import KEY_RANGE

ERROR_ID = re.compile(r"internal error ([0-9a-f]{12}) \(\w+\); .*")
GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture
def engine() -> Iterator[Engine]:
    failures: list[BaseException] = []
    engine = Engine(resolve("target-only").settings, on_failure=failures.append)
    engine.failures = failures
    engine.start()
    assert engine.wait_ready(60)
    yield engine
    engine.stop()


def run(engine: Engine, request: RowRequest, sink=None) -> queue.Queue[Event]:
    events: queue.Queue[Event] = queue.Queue()
    engine.submit(Job(request=request, request_id=f"r{id(events)}", route="test", sink=sink or events.put))
    return events


def last_event(events: queue.Queue[Event]) -> Event:
    return events.get(timeout=30)


def logged(stream: io.StringIO, name: str) -> list[dict]:
    lines = [json.loads(line) for line in stream.getvalue().splitlines() if line.startswith("{")]
    return [e for e in lines if e["event"] == name]


def ok_request() -> RowRequest:
    return RowRequest(prompt=[11, 42, 7], sampling=GREEDY, max_tokens=4)


@pytest.mark.parametrize(
    ("request_", "stage", "error_type"),
    [
        # A prompt the HTTP layer would never pass: it only blows up in the first forward (a tick).
        (RowRequest(prompt=["not a token"], sampling=GREEDY, max_tokens=4), "tick", "ValueError"),
        # A seed that is no integer only fails when the row's key stream is made (admission).
        (RowRequest(prompt=[11, 42], sampling=GREEDY, max_tokens=4, seed="x"), "admit", "TypeError"),
    ],
    ids=["tick", "admit"],
)
def test_a_row_that_raises_fails_alone_with_an_error_id(engine, log, request_, stage, error_type) -> None:
    failed = last_event(run(engine, request_))
    assert isinstance(failed, Failed) and failed.code == 500
    error_id = ERROR_ID.fullmatch(failed.message).group(1)
    entry = next(e for e in logged(log, "row_failed") if e["error_id"] == error_id)
    assert entry["stage"] == stage and entry["error_type"] == error_type
    assert "Traceback" in entry["exception"]
    assert isinstance(last_event(run(engine, ok_request())), Finished)
    assert engine.state is EngineState.READY and not engine.failures


def test_a_broken_loop_turns_the_engine_failed_and_fails_every_request(engine, log) -> None:
    def fatal_sink(event: Event) -> None:
        raise SystemExit("the loop cannot go on")  # not an Exception: no row handler may swallow it

    running = run(engine, RowRequest(prompt=[11, 42], sampling=GREEDY, max_tokens=2000), None)
    run(engine, ok_request(), fatal_sink)
    failed = last_event(running)
    while not isinstance(failed, Failed):
        failed = last_event(running)
    assert failed.code == 503 and "the engine failed" in failed.message
    assert engine.state is EngineState.FAILED
    assert len(engine.failures) == 1 and isinstance(engine.failures[0], SystemExit)
    assert logged(log, "engine_failed")[0]["error_type"] == "SystemExit"
    with pytest.raises(UnavailableError):
        run(engine, ok_request())


def test_a_seed_beyond_64_bits_is_reduced_and_reported(target_only_server) -> None:
    """Before: the seed reached mx.random.key raw, killed the engine thread, and this hung."""
    request = {"prompt": "def add(a, b):\n", "n_predict": 8, "temperature": 0.9, "ignore_eos": True}
    with target_only_server.client() as http:
        huge = http.post("/completion", json=request | {"seed": 2**70 + 5})
        same = http.post("/completion", json=request | {"seed": 5})
        negative = http.post("/completion", json=request | {"seed": -7})
        random = http.post("/completion", json=request | {"seed": -1})
        assert http.get("/health").status_code == 200
    assert huge.status_code == 200, huge.text
    assert huge.json()["generation_settings"]["seed"] == 5
    assert huge.json()["content"] == same.json()["content"]
    assert negative.json()["generation_settings"]["seed"] == KEY_RANGE - 7
    assert 0 <= random.json()["generation_settings"]["seed"] < 2**32
