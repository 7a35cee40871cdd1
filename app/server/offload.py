"""Work that scales with a request's input (tokenizing, rendering the chat template, shaping a
big answer), off the event loop and bounded.

A thread alone does not keep the event loop answering: the tokenizer and the shaping code hold
the interpreter lock for stretches that grow with the text, and six concurrent 4 MB texts held
`/health` for 10 to 28 s. So the work goes by the request's size: a request whose body is at
most SMALL_BODY_BYTES (every ordinary prompt) runs in the loop's default thread pool, as before;
a larger one waits its turn for the one HEAVY lane, so at most one such job contends with the
event loop at a time, and the small requests beside it never queue behind it. More heavy jobs
waiting than `server.max_queue` get a 503.

What a large request allocated stays with the process once freed (glibc keeps it in its
arenas: four concurrent megabyte tokenizations left the server 176 MB larger, idle), so within
RECLAIM_S after one, the free memory goes back to the system (app/runtime/memory.py).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from typing import TypeVar

from litestar import Litestar, Request

from app.runtime.memory import release_free_memory
from app.server.errors import ApiError

T = TypeVar("T")
SMALL_BODY_BYTES = 64 * 1024  # a request body up to this runs beside the others
RECLAIM_S = 0.5  # how soon after a large request its freed memory goes back
HEAVY = ThreadPoolExecutor(max_workers=1, thread_name_prefix="heavy")  # one big input at a time


class HeavyLane:
    """The waiting count in front of the heavy thread (its bound is `server.max_queue`), and
    when the last heavy job ended."""

    def __init__(self) -> None:
        self.waiting = 0
        self.ended = 0.0
        self._lock = threading.Lock()

    def enter(self, limit: int) -> None:
        with self._lock:
            if self.waiting >= limit:
                raise ApiError(
                    503, f"{self.waiting} large requests are already waiting; try again later", "unavailable_error"
                )
            self.waiting += 1

    def leave(self) -> None:
        with self._lock:
            self.waiting -= 1
            self.ended = time.monotonic()


LANE = HeavyLane()


async def run(request: Request, work: Callable[..., T], *args: object, **kwargs: object) -> T:
    """`work(*args, **kwargs)` in a thread: the heavy lane when the request's body is large."""
    body = await request.body()
    if len(body) <= SMALL_BODY_BYTES:
        return await asyncio.to_thread(work, *args, **kwargs)
    LANE.enter(request.app.state.settings.server.max_queue)
    try:
        return await asyncio.get_running_loop().run_in_executor(HEAVY, partial(work, *args, **kwargs))
    finally:
        LANE.leave()


def reclaim_lifespan() -> Callable[[Litestar], AbstractAsyncContextManager[None]]:
    """While the app runs: once no heavy job has ended for RECLAIM_S (its request answered by then),
    hand the free memory back, off the loop."""

    async def reclaim() -> None:
        reclaimed = 0.0
        while True:
            await asyncio.sleep(RECLAIM_S / 2)
            ended = LANE.ended
            if ended > reclaimed and not LANE.waiting and time.monotonic() - ended >= RECLAIM_S:
                reclaimed = ended
                await asyncio.to_thread(release_free_memory)

    @asynccontextmanager
    async def run_reclaim(_: Litestar) -> AsyncIterator[None]:
        task = asyncio.create_task(reclaim())
        try:
            yield
        finally:
            task.cancel()

    return run_reclaim
