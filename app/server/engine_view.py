"""The HTTP layer's one door to the engine: a read-only view, its DI provider and the readiness guard.

Only this module imports app.engine, so a change to the engine's internals (how rows, the loaded
target or the event types are held) is absorbed here and no route changes with it.

The app serves whichever engine `app.state.engines` (an EngineSwitch) holds as current: a hot
reload swaps it. Each request's handler gets a view of the engine current when it began, held
until the handler returns, so a request never spans two engines. With a router
(`app.state.router`, app/engine/router.py) the request's `model` (its body's, or the query's on a
GET) picks the model whose engine it holds, waiting up to `router.load_wait_s` for its load.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, ExitStack, asynccontextmanager
from dataclasses import dataclass

from litestar import Litestar, Request
from litestar.connection import ASGIConnection
from litestar.datastructures import State
from litestar.exceptions import SerializationException
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
from app.engine.router import ClosedError, Route, Router, Status
from app.engine.row import Job
from app.engine.snapshot import RowView
from app.engine.switch import EngineSwitch
from app.profiles.schema import Settings
from app.server.errors import ApiError, quoted

LOAD_POLL_S = 0.02  # how often a request waiting for its model's load looks again

__all__ = [
    "Delta",
    "Engine",
    "EngineSwitch",
    "EngineView",
    "Event",
    "Failed",
    "Finished",
    "Job",
    "Listed",
    "Metrics",
    "Progress",
    "ReloadRefusedError",
    "Reloader",
    "Route",
    "Router",
    "RowView",
    "Started",
    "Timings",
    "engine_lifespan",
    "listed",
    "provide_engine",
    "reload_model",
    "require_ready",
    "served_metrics",
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


async def provide_engine(request: Request, state: State) -> AsyncIterator[EngineView]:
    """The `engine` dependency of every handler that asks for one: the current engine (of the
    model the request names, with a router), held until the handler returns (its rows are
    submitted by then, and keep the engine running)."""
    router: Router | None = state.router
    if router is None:
        with state.engines.hold() as engine:
            yield EngineView(engine)
        return
    route = await requested_route(request, router)
    request.scope["state"]["model"] = route.name  # the access event's `model` (app/server/access.py)
    with ExitStack() as held:
        try:  # off the event loop: an unloaded model's engine is built there
            engine = await asyncio.to_thread(held.enter_context, router.hold(route))
        except ClosedError as exc:
            raise ApiError(503, unavailable_message(EngineState.DRAINING)) from exc
        await loaded(router, route, engine)
        yield EngineView(engine)


async def requested_route(request: Request, router: Router) -> Route:
    """The route the request's `model` names (a GET's query, else the JSON body's); 404 if none."""
    model = request.query_params.get("model") if request.method in ("GET", "HEAD") else await body_model(request)
    route = router.find(model)
    if route is None:
        known = ", ".join(repr(name) for name in router.names)
        raise ApiError(404, f"model {quoted(model)} not found; this server serves {known}", "not_found_error")
    return route


async def body_model(request: Request) -> str | None:
    """The body's `model` string, if it has one; a body that is no JSON object names none (the
    route's own decoding answers it as before)."""
    try:
        body = await request.json()
    except SerializationException:
        return None
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) else None


async def loaded(router: Router, route: Route, engine: Engine) -> None:
    """Until the held engine serves; 503 with Retry-After past `router.load_wait_s`, or for a load
    that failed. It loads on its own thread: other models serve meanwhile."""
    deadline = time.monotonic() + router.load_wait_s
    while engine.state is EngineState.LOADING:
        if time.monotonic() >= deadline:
            retry = str(math.ceil(router.load_wait_s))
            raise ApiError(503, f"model {route.name!r} is loading; try again", headers={"Retry-After": retry})
        await asyncio.sleep(LOAD_POLL_S)
    if engine.state is EngineState.FAILED:
        raise ApiError(503, f"model {route.name!r} did not load: {engine.failure}", headers={"Retry-After": "1"})


def require_ready(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    """Guard: 503 in llama-server's envelope while the engine loads, drains or after it failed
    (with a router: while it drains; a model's load is its requests' wait, `loaded`)."""
    router: Router | None = connection.app.state.router
    if router is not None:
        if router.closing:
            raise ApiError(503, unavailable_message(EngineState.DRAINING))
        return
    reason = EngineView(connection.app.state.engines.current).unavailable
    if reason is not None:
        raise ApiError(503, reason)


def served_metrics(state: State) -> Metrics | dict[str, Metrics]:
    """The engine's metrics; with a router, each loaded model's by its name."""
    router: Router | None = state.router
    if router is None:
        return EngineView(state.engines.current).metrics
    return {route.name: EngineView(engine).metrics for route in router.routes if (engine := route.serving)}


async def reload_model(state: State, request: Request, trigger: str) -> EngineView:
    """POST /admin/reload: the profile reloaded (with a router, the model the body names, else the
    first); ReloadRefusedError if refused."""
    router: Router | None = state.router
    if router is None:
        return EngineView(await asyncio.to_thread(state.reloader.reload, trigger))
    route = await requested_route(request, router)
    return EngineView(await asyncio.to_thread(router.reload, route, trigger))


@dataclass(frozen=True)
class Listed:
    """One served model as the listings show it: its profile, whether it is loaded (None: no
    router, the one model is always the server's), and its engine while it serves."""

    settings: Settings
    status: Status | None
    engine: EngineView | None


def listed(state: State) -> list[Listed]:
    """Every model the server serves, loaded or not, in the router's order; none is loaded for it."""
    router: Router | None = state.router
    if router is None:
        view = EngineView(state.engines.current)
        return [Listed(view.settings, None, view if view.unavailable is None else None)]
    return [
        Listed(route.settings, route.status, EngineView(engine) if (engine := route.serving) else None)
        for route in router.routes
    ]


def engine_lifespan(engines: EngineSwitch | Router) -> Callable[[Litestar], AbstractAsyncContextManager[None]]:
    """The engine's thread runs while the app does (and a reload's, until they are replaced)."""

    @asynccontextmanager
    async def run(_: Litestar) -> AsyncIterator[None]:
        engines.start()
        try:
            yield
        finally:
            engines.stop()

    return run
