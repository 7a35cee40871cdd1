"""Work that scales with a request's input (tokenizing, rendering the chat template, shaping a
big answer), off the event loop and bounded.

A thread alone does not keep the event loop answering: the tokenizer and the shaping code hold
the interpreter lock for stretches that grow with the text, and six concurrent 4 MB texts held
`/health` for 10 to 28 s. So the work goes by the request's size: a request whose body is at
most SMALL_BODY_BYTES (every ordinary prompt) runs in the loop's default thread pool, as before;
a larger one waits its turn for the one HEAVY lane, so at most one such job contends with the
event loop at a time, and the small requests beside it never queue behind it. More heavy jobs
waiting than `server.max_queue` get a 503.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TypeVar

from litestar import Request

from app.server.errors import ApiError

T = TypeVar("T")
SMALL_BODY_BYTES = 64 * 1024  # a request body up to this runs beside the others
HEAVY = ThreadPoolExecutor(max_workers=1, thread_name_prefix="heavy")  # one big input at a time


class HeavyLane:
    """The waiting count in front of the heavy thread (its bound is `server.max_queue`)."""

    def __init__(self) -> None:
        self.waiting = 0
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
