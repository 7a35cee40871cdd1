"""The HTTP layer's one door to the engine: a read-only view, its DI provider and the readiness guard.

Only this module imports app.engine, so a change to the engine's internals (how rows, the loaded
target or the event types are held) is absorbed here and no route changes with it.

The app serves whichever engine `app.state.engines` (an EngineSwitch) holds as current: a hot
reload swaps it. Each request's handler gets a view of the engine current when it began, held
until the handler returns, so a request never spans two engines.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from litestar import Litestar
from litestar.connection import ASGIConnection
from litestar.datastructures import State
from litestar.handlers import BaseRouteHandler
from litestar.types import Receive
from mlx_lm.tokenizer_utils import TokenizerWrapper

from app.decoding.plan import LoopPlan
from app.decoding.row_events import Delta, Event, Failed, Finished, Progress, Started
from app.decoding.timings import Timings
from app.engine.engine import Engine, EngineState, UnavailableError, unavailable_message
from app.engine.host import ModelInfo
from app.engine.metrics import Metrics
from app.engine.reload import Reloader, ReloadRefusedError
from app.engine.row import Job
from app.engine.snapshot import RowView
from app.engine.switch import EngineSwitch
from app.profiles.schema import Settings
from app.server.errors import ApiError

__all__ = [
    "Delta",
    "Engine",
    "EngineSwitch",
    "EngineView",
    "Event",
    "Failed",
    "Finished",
    "Job",
    "Metrics",
    "Progress",
    "ReloadRefusedError",
    "Reloader",
    "RowView",
    "Started",
    "Timings",
    "engine_lifespan",
    "provide_engine",
    "require_ready",
]


class EngineView:
    """What the HTTP layer reads from the engine, and the one thing it asks of it: `submit`."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    @property
    def unavailable(self) -> str | None:
        """Why requests get 503 now (loading, draining, failed); None while serving."""
        state = self._engine.state
        return None if state is EngineState.READY else unavailable_message(state)

    @property
    def settings(self) -> Settings:
        return self._engine.settings

    @property
    def plan(self) -> LoopPlan:
        return self._engine.plan

    @property
    def metrics(self) -> Metrics:
        return self._engine.snapshot().metrics

    # Loaded-model facts: only while serving (the guard, or an `unavailable` check, comes first).

    @property
    def model(self) -> ModelInfo:
        assert self._engine.model is not None
        return self._engine.model

    @property
    def tokenizer(self) -> TokenizerWrapper:
        return self.model.tokenizer

    @property
    def writes_thinking(self) -> bool:
        """The chat template in use has thinking tags (decided once, at load)."""
        return self.model.writes_thinking

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    @property
    def context_limit(self) -> int:
        return self.model.context_limit

    def rows(self) -> dict[int, RowView]:
        """The running rows by slot, copied so the engine thread may go on changing its own."""
        return {row.slot: row for row in self._engine.snapshot().rows}

    def submit(self, job: Job) -> None:
        try:
            self._engine.submit(job)
        except UnavailableError as exc:
            raise ApiError(503, str(exc)) from exc

    async def embed(self, prompts: list[list[int]], pooling: str, receive: Receive) -> list[list[list[float]]]:
        """The target's embedding of each prompt (one pooled row, or a row per token with pooling
        `none`), computed on the engine thread between ticks. `receive` is the request's ASGI
        channel, its body read: its next message is the client's disconnect, which stops the work
        at its next chunk (a 499, as for rows)."""
        try:
            work = asyncio.wrap_future(self._engine.embed(prompts, pooling))
        except UnavailableError as exc:
            raise ApiError(503, str(exc)) from exc
        gone = asyncio.ensure_future(_disconnect(receive))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not work.done():
                work.cancel()
                raise ApiError(499, "the client disconnected", "cancelled")
            return work.result()
        except UnavailableError as exc:
            raise ApiError(503, str(exc)) from exc
        finally:
            gone.cancel()


async def _disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def provide_engine(state: State) -> Iterator[EngineView]:
    """The `engine` dependency of every handler that asks for one: the current engine, held
    until the handler returns (its rows are submitted by then, and keep the engine running)."""
    with state.engines.hold() as engine:
        yield EngineView(engine)


def require_ready(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    """Guard: 503 in llama-server's envelope while the engine loads, drains or after it failed."""
    reason = EngineView(connection.app.state.engines.current).unavailable
    if reason is not None:
        raise ApiError(503, reason)


def engine_lifespan(engines: EngineSwitch) -> Callable[[Litestar], AbstractAsyncContextManager[None]]:
    """The engine's thread runs while the app does (and a reload's, until they are replaced)."""

    @asynccontextmanager
    async def run(_: Litestar) -> AsyncIterator[None]:
        engines.start()
        try:
            yield
        finally:
            engines.stop()

    return run
