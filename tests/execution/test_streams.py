"""Pooled MLX streams keep their taker's CPU priority (app/execution/streams.py).

A CPU stream's worker thread starts on the stream's first evaluation and takes the priority of
the thread that evaluates. A router's load runs niced: when the serving engines' stream workers
were started by a load, their forwards ran at the load's priority (a served model's inter-token
gap 1.5x to 2.1x its idle one while another loaded, against 1.07x to 1.17x after).
"""

from __future__ import annotations

import os
import sys
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import pytest

from app.execution.streams import pooled_streams

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="thread priorities are read from /proc")


def threads() -> dict[int, int]:
    """This process's native threads and their nice values."""
    found = {}
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except FileNotFoundError:  # ended meanwhile
            continue
        found[int(task.name)] = int(stat[stat.rindex(")") + 2 :].split()[16])
    return found


PYTHON_THREADS: set[int] = set()  # the threads on_thread started (the rest are MLX's workers)


def on_thread(work: Callable[[], None], niceness: int = 0) -> None:
    def run() -> None:
        PYTHON_THREADS.add(threading.get_native_id())
        if niceness:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), niceness)
        work()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()


def test_a_serving_streams_worker_keeps_its_takers_priority_whoever_evaluates_first() -> None:
    before = threads()
    taken: list[mx.Stream] = []

    def engine_thread() -> None:  # it takes its streams, then a niced load computes on them first
        with pooled_streams(f"serving-{uuid.uuid4()}"):  # a pool of its own: a stream made now
            taken.append(mx.default_stream(mx.default_device()))
            on_thread(lambda: mx.eval(mx.add(mx.ones((4,), stream=taken[0]), 1, stream=taken[0])), niceness=10)

    on_thread(engine_thread)
    started = {tid: nice for tid, nice in threads().items() if tid not in before and tid not in PYTHON_THREADS}
    assert started and set(started.values()) == {0}, started


def test_a_loads_streams_are_a_pool_of_their_own() -> None:
    streams: dict[str, mx.Stream] = {}

    def take(pool: str) -> Callable[[], None]:
        def run() -> None:
            with pooled_streams(pool):
                streams[pool] = mx.default_stream(mx.default_device())

        return run

    on_thread(take("loading"), niceness=10)  # given back to the loading pool when it ends
    on_thread(take("serving"))
    assert streams["serving"] != streams["loading"]
