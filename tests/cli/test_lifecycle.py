"""Process and request lifecycle of a real server: cancellation, fair prefill, restart, shutdown."""

from __future__ import annotations

import itertools
import json
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from app.cli.serving import REPEAT_WINDOW_S
from app.decoding.builder import LoopBuilder, RowRequest
from app.decoding.plan import LoopPlan
from app.execution.runner import PREFILL_CHUNK
from app.sampling import SamplingParams
from tests.support.server import RunningServer, free_port, serve

LONG_STREAM = {"prompt": "def main():\n", "n_predict": 3000, "ignore_eos": True, "temperature": 0, "stream": True}


def wait_until(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


# --- cancellation ---------------------------------------------------------------------------


def test_abandoned_non_streaming_requests_stop_their_rows(target_only_server) -> None:
    """Before: each abandoned row decoded its 3000 tokens, and the next request waited for them."""
    request = {k: v for k, v in LONG_STREAM.items() if k != "stream"}

    def abandon(_: int) -> None:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{target_only_server.url}/completion", json=request, timeout=1.0)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(abandon, range(4)))
    target_only_server.wait_idle(timeout=5.0)
    started = time.monotonic()
    short = httpx.post(f"{target_only_server.url}/completion", json=request | {"n_predict": 8}, timeout=30)
    assert short.status_code == 200 and time.monotonic() - started < 5.0
    assert len(target_only_server.events("request_cancelled")) >= 4


# --- prefill across ticks -------------------------------------------------------------------


def test_a_long_prompt_prefilled_across_ticks_decodes_the_same(embedded_target, embedded_drafter) -> None:
    """T = 0: a draft-model row whose prefill is interleaved with another row's steps, chunk by
    chunk, decides exactly what the same row decides prefilled in one go."""
    builder = LoopBuilder(embedded_target, embedded_drafter, LoopPlan(drafter_kind="draft-model"))
    prompt = [(i * 37) % 900 + 10 for i in range(PREFILL_CHUNK * 2 + 100)]
    request = RowRequest(prompt=prompt, sampling=SamplingParams(temperature=0.0), max_tokens=24, ignore_eos=True)
    solo = builder.build(request)
    solo.prefill()
    while not solo.finished:
        solo.step()
    chunked, other = builder.build(request), builder.build(RowRequest(prompt=[5, 6, 7], **_short()))
    other.prefill()
    chunks = 0
    while not chunked.prefilled:
        chunked.prefill_chunk()
        chunks += 1
        other.step()
    while not chunked.finished:
        chunked.step()
    assert chunks >= 3
    assert chunked.emitted == solo.emitted


def _short() -> dict:
    return {"sampling": SamplingParams(temperature=0.0), "max_tokens": 400, "ignore_eos": True}


def stream_arrivals(server: RunningServer, done: threading.Event, arrivals: list[float]) -> None:
    """Stream a long completion, noting when each frame arrives, up to the first one after `done`."""
    with httpx.stream("POST", f"{server.url}/completion", json=LONG_STREAM, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                arrivals.append(time.perf_counter())
                if done.is_set():
                    return


@pytest.mark.slow
def test_a_long_prompt_delays_a_running_stream_by_about_one_chunk(tmp_path: Path) -> None:
    """Before: the whole prompt was prefilled in one tick and the stream stood still meanwhile.

    The chunk time is measured under the same load: the long prompt's own prefill time over its
    chunks (the stream's steps between them included)."""
    chunks = 4
    env = {"MLXCEL_SERVER__MAX_PROMPT_TOKENS": "8192"}
    with serve(tmp_path, "--profile", "target-only", env=env) as server:
        words = " ".join(f"w{i}" for i in range(3000))
        tokens = httpx.post(f"{server.url}/tokenize", json={"content": words}).json()["tokens"]
        tokens = tokens[: PREFILL_CHUNK * chunks]
        done, arrivals = threading.Event(), []
        stream = threading.Thread(target=stream_arrivals, args=(server, done, arrivals))
        stream.start()
        time.sleep(0.5)
        start = time.perf_counter()
        long = httpx.post(f"{server.url}/completion", json={"prompt": tokens, "n_predict": 1}, timeout=120).json()
        end = time.perf_counter()
        done.set()
        stream.join(120)
    # Every wait between two frames that overlaps the long request, the last one included.
    gaps = [b - a for a, b in itertools.pairwise(arrivals) if b > start and a < end]
    chunk_s = long["timings"]["prompt_ms"] / 1000.0 / chunks
    assert long["tokens_evaluated"] == len(tokens) == PREFILL_CHUNK * chunks
    assert len(gaps) >= chunks
    assert max(gaps) < 2.5 * chunk_s, (max(gaps), chunk_s)


# --- restart and shutdown -------------------------------------------------------------------

DRAIN = "MLXCEL_SERVER__DRAIN_TIMEOUT_S"


def after_first_frame(response: httpx.Response) -> Iterator[str]:
    """The response's lines after its first SSE frame (keep it: dropping it closes the connection)."""
    lines = response.iter_lines()
    next(line for line in lines if line.startswith("data: "))
    return lines


def frames(lines: Iterator[str]) -> list[dict]:
    return [json.loads(line[len("data: ") :]) for line in lines if line.startswith("data: {")]


@pytest.mark.slow
def test_a_restart_on_the_same_port_starts_and_a_drain_lets_a_stream_finish(tmp_path: Path) -> None:
    """Before: the restart exited 2 ("port already in use") while the first run's TIME_WAIT
    sockets held the port, and SIGTERM ended the process (status 143) without a drain."""
    port = free_port()
    # A kept-alive connection that the server closes when it stops leaves TIME_WAIT on its port.
    with (
        serve(tmp_path, "--profile", "target-only", port=port) as first,
        httpx.Client(base_url=first.url, timeout=60) as http,
    ):
        for _ in range(3):
            assert http.post("/completion", json={"prompt": "x", "n_predict": 2}).status_code == 200
        first.process.send_signal(signal.SIGTERM)
        assert first.process.wait(30) == 0
    with (
        serve(tmp_path, "--profile", "target-only", port=port, env={DRAIN: "120"}) as second,
        httpx.stream("POST", f"{second.url}/completion", json=LONG_STREAM | {"n_predict": 200}, timeout=60) as r,
    ):
        lines = after_first_frame(r)
        second.process.send_signal(signal.SIGTERM)
        assert wait_until(lambda: httpx.get(f"{second.url}/health").status_code == 503, timeout=5)
        refused = httpx.post(f"{second.url}/completion", json={"prompt": "x", "n_predict": 2})
        assert refused.status_code == 503
        assert refused.json()["error"]["message"] == "the server is shutting down"
        last = frames(lines)[-1]
        assert last["stop"] is True and last["tokens_predicted"] == 200
        assert second.process.wait(30) == 0


@pytest.mark.slow
def test_a_drain_that_times_out_ends_streams_with_an_error_frame_and_exits_0(tmp_path: Path) -> None:
    drain_s = 0.5
    with (
        serve(tmp_path, "--profile", "target-only", env={DRAIN: str(drain_s)}) as server,
        httpx.stream("POST", f"{server.url}/completion", json=LONG_STREAM, timeout=60) as r,
    ):
        lines = after_first_frame(r)
        server.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        error = frames(lines)[-1]["error"]
        assert error["code"] == 503 and error["message"] == "the server shut down before this request finished"
        assert server.process.wait(30) == 0
        assert time.monotonic() - signalled < drain_s + 5.0


@pytest.mark.slow
def test_a_second_sigterm_exits_at_once(tmp_path: Path) -> None:
    """A second SIGTERM exits at once; the same signal again within REPEAT_WINDOW_S is the first
    delivered twice (to a process group, and again by a parent that forwards it, as make does)."""
    with (
        serve(tmp_path, "--profile", "target-only", env={DRAIN: "120"}) as server,
        httpx.stream("POST", f"{server.url}/completion", json=LONG_STREAM, timeout=60) as r,
    ):
        lines = after_first_frame(r)
        server.process.send_signal(signal.SIGTERM)
        server.process.send_signal(signal.SIGTERM)  # forwarded: the same stop
        next(line for line in lines if line.startswith("data: "))  # the stream goes on while draining
        time.sleep(REPEAT_WINDOW_S + 0.2)
        assert server.process.poll() is None
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(5) == 128 + signal.SIGTERM
