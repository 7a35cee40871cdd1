"""The Litestar application: routes, error envelope, and the engine's lifespan."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager

from litestar import Litestar, Router
from litestar.config.cors import CORSConfig
from litestar.handlers import HTTPRouteHandler
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin

from app import __version__
from app.engine.engine import Engine
from app.server.auth import require_api_key
from app.server.body import StrictJsonRequest
from app.server.errors import HANDLERS
from app.server.routes import basics, chat, completions, introspection, unsupported
from app.server.streaming import REQUEST_ID

ROUTES = [*basics.ROUTES, *completions.ROUTES, *chat.ROUTES, *introspection.ROUTES, *unsupported.ROUTES]
# As llama-server: any origin may call (the API key, not the origin, is the gate); browsers may
# read the request id.
CORS = CORSConfig(allow_origins=["*"], expose_headers=[REQUEST_ID])


def with_head(handlers: Iterable[HTTPRouteHandler]) -> None:
    """HEAD on every GET route: the GET handler answers and uvicorn sends its headers only."""
    for handler in handlers:
        if "GET" in handler.http_methods:
            handler.http_methods.add("HEAD")


def openapi_config() -> OpenAPIConfig:
    """The OpenAPI schema Litestar derives from the request Structs, at /schema/openapi.json.

    Public like /health (the schema tells nothing a client could not read in docs/server.md);
    JSON only, no documentation UI that would fetch scripts from a CDN."""
    docs = Router("/schema", route_handlers=[], include_in_schema=False, opt={"public": True})
    return OpenAPIConfig(title="mlxcel", version=__version__, render_plugins=[JsonRenderPlugin()], openapi_router=docs)


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

    with_head(ROUTES)
    app = Litestar(
        route_handlers=ROUTES,
        exception_handlers=HANDLERS,
        guards=[require_api_key],
        lifespan=[run_engine],
        openapi_config=openapi_config(),
        request_class=StrictJsonRequest,
        request_max_body_size=engine.settings.server.max_body_bytes,
        cors_config=CORS,
    )
    app.state.engine = engine
    return app
