"""The HTTP layer's one door to the engine: a read-only view, its DI provider and the readiness guard.

Only this module imports app.engine, so a change to the engine's internals (how rows, the loaded
target or the event types are held) is absorbed here and no route changes with it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass

from litestar import Litestar
from litestar.connection import ASGIConnection
from litestar.datastructures import State
from litestar.handlers import BaseRouteHandler
from mlx_lm.tokenizer_utils import TokenizerWrapper

from app.decoding.builder import RowRequest
from app.decoding.plan import LoopPlan
from app.engine.engine import Engine, EngineState, UnavailableError, unavailable_message
from app.engine.metrics import Metrics
from app.engine.row import Event, Failed, Finished, Job, Row, Update
from app.engine.timings import Timings
from app.profiles.schema import Settings
from app.server.errors import ApiError

__all__ = [
    "Engine",
    "EngineView",
    "Event",
    "Failed",
    "Finished",
    "Job",
    "Metrics",
    "RowView",
    "Timings",
    "Update",
    "engine_lifespan",
    "provide_engine",
    "require_ready",
]


@dataclass(frozen=True)
class DraftCounts:
    """A running row's drafting so far (None on a row that runs no drafter)."""

    proposed: int
    accepted: int
    rounds: int


@dataclass(frozen=True)
class RowView:
    """What /slots shows of a running row."""

    request_id: str
    request: RowRequest
    n_decoded: int
    has_next_token: bool
    draft: DraftCounts | None


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
        return self._engine.metrics

    # Loaded-model facts: only while serving (the guard, or an `unavailable` check, comes first).

    @property
    def tokenizer(self) -> TokenizerWrapper:
        return self._engine.target.tokenizer

    @property
    def vocab_size(self) -> int:
        return self._engine.target.vocab_size

    @property
    def context_limit(self) -> int:
        assert self._engine.builder is not None
        return self._engine.builder.context_limit

    def rows(self) -> dict[int, RowView]:
        """The running rows by slot, copied so the engine thread may go on changing its own."""
        return {slot: _row_view(row) for slot, row in dict(self._engine.rows).items()}

    def submit(self, job: Job) -> None:
        try:
            self._engine.submit(job)
        except UnavailableError as exc:
            raise ApiError(503, str(exc)) from exc


def _row_view(row: Row) -> RowView:
    generation, job = row.generation, row.job
    stats = generation.loop.stats
    draft = None if stats is None else DraftCounts(stats.proposed, stats.accepted, stats.rounds)
    return RowView(job.request_id, job.request, len(generation.emitted), not generation.finished, draft)


def provide_engine(state: State) -> EngineView:
    """The `engine` dependency of every handler that asks for one."""
    return state.engine


def require_ready(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    """Guard: 503 in llama-server's envelope while the engine loads, drains or after it failed."""
    reason = connection.app.state.engine.unavailable
    if reason is not None:
        raise ApiError(503, reason)


def engine_lifespan(engine: Engine) -> Callable[[Litestar], AbstractAsyncContextManager[None]]:
    """The engine's thread runs while the app does."""

    @asynccontextmanager
    async def run(_: Litestar) -> AsyncIterator[None]:
        engine.start()
        try:
            yield
        finally:
            engine.stop()

    return run
