"""Between HTTP handlers and the engine thread: readiness, submitting jobs, awaiting events."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from litestar import Request
from litestar.types import Receive

from app.decoding.builder import RowRequest
from app.decoding.generation import Delta
from app.engine.engine import Engine, EngineState, UnavailableError, unavailable_message
from app.engine.row import Event, Failed, Finished, Job
from app.profiles.schema import Settings
from app.server.errors import ApiError

DISCONNECTED = Failed("the client disconnected", 499, "cancelled")  # nginx's "client closed request"


def engine_of(request: Request) -> Engine:
    return request.app.state.engine


def ready_engine(request: Request) -> Engine:
    """The engine, or 503 in llama-server's envelope while it loads, drains or after it failed."""
    engine = engine_of(request)
    if engine.state is not EngineState.READY:
        raise ApiError(503, unavailable_message(engine.state))
    return engine


def model_alias(settings: Settings) -> str:
    return settings.server.model_alias or Path(settings.target).name


@dataclass
class Submission:
    """A job in flight and the queue its events arrive on."""

    job: Job
    events: asyncio.Queue[Event]
    receive: Receive  # the request's ASGI channel: its next message is the client's disconnect

    async def result(self) -> Finished:
        """Wait for the whole result (non-streaming requests); a client that leaves stops its row."""
        watcher = asyncio.create_task(self._watch_disconnect())
        try:
            while True:
                event = await self.events.get()
                if isinstance(event, Failed):
                    raise ApiError(event.code, event.message, event.kind)
                if isinstance(event, Finished):
                    return event
        finally:
            watcher.cancel()
            self.job.cancelled = True  # no-op once finished; stops the row if the client went away

    async def _watch_disconnect(self) -> None:
        """The body is read by now, so the only message left to receive is `http.disconnect`."""
        while (await self.receive())["type"] != "http.disconnect":
            pass
        self.job.cancelled = True
        self.events.put_nowait(DISCONNECTED)  # the engine sends nothing to a cancelled row

    async def stream(self) -> AsyncIterator[Delta | Finished | Failed]:
        """Events as the engine produces them; a client that disconnects stops its row.

        Deltas that queued up while the last frame was being sent go out as one frame, so a
        slow reader costs fewer frames instead of falling further behind.
        """
        try:
            while True:
                event = await self.events.get()
                while isinstance(event, Delta) and not self.events.empty():
                    following = self.events.get_nowait()
                    if not isinstance(following, Delta):
                        yield event
                        event = following
                        break
                    event = merge(event, following)
                yield event
                if isinstance(event, Finished | Failed):
                    return
        finally:
            self.job.cancelled = True


def merge(first: Delta, second: Delta) -> Delta:
    return Delta(text=first.text + second.text, tokens=first.tokens + second.tokens, timings=second.timings)


def submit(
    request: Request, engine: Engine, row_request: RowRequest, route: str, stream: bool, per_token_timings: bool
) -> Submission:
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[Event] = asyncio.Queue()

    def sink(event: Event) -> None:
        loop.call_soon_threadsafe(events.put_nowait, event)

    job = Job(
        request=row_request,
        request_id=uuid.uuid4().hex[:16],
        route=route,
        sink=sink,
        stream=stream,
        per_token_timings=per_token_timings,
    )
    try:
        engine.submit(job)
    except UnavailableError as exc:
        raise ApiError(503, str(exc)) from exc
    return Submission(job, events, request.receive)
