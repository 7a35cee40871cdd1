"""The Litestar application: routes, error envelope, and the engine's lifespan."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from litestar import Litestar

from app.engine.engine import Engine
from app.server.auth import require_api_key
from app.server.errors import HANDLERS
from app.server.routes import basics, chat, completions, introspection, unsupported

ROUTES = [*basics.ROUTES, *completions.ROUTES, *chat.ROUTES, *introspection.ROUTES, *unsupported.ROUTES]
MAX_BODY_BYTES = 16 * 1024 * 1024


def create_app(engine: Engine) -> Litestar:
    """The app takes its engine as an argument: the listener comes up at once while the engine
    loads models on its own thread, answering 503 until they are ready."""

    @asynccontextmanager
    async def run_engine(_: Litestar) -> AsyncIterator[None]:
        engine.start()
        try:
            yield
        finally:
            engine.stop()

    app = Litestar(
        route_handlers=ROUTES,
        exception_handlers=HANDLERS,
        guards=[require_api_key],
        lifespan=[run_engine],
        openapi_config=None,
        request_max_body_size=MAX_BODY_BYTES,
    )
    app.state.engine = engine
    return app
