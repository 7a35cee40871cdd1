"""The Litestar application: controllers, the engine dependency, the error envelope and the lifespan."""

from __future__ import annotations

from litestar import Controller, Litestar
from litestar.config.cors import CORSConfig
from litestar.di import Provide
from litestar.handlers import HTTPRouteHandler

from app.server.auth import require_api_key
from app.server.body import StrictJsonRequest
from app.server.engine_view import Engine, EngineView, engine_lifespan, provide_engine
from app.server.errors import HANDLERS
from app.server.openapi import openapi_config
from app.server.routes.chat import ChatController
from app.server.routes.completions import OpenAICompletionController
from app.server.routes.introspection import IntrospectionController
from app.server.routes.native import NativeCompletionController
from app.server.routes.tokens import TokensController
from app.server.routes.unsupported import UnsupportedController
from app.server.streaming import REQUEST_ID

CONTROLLERS: list[type[Controller]] = [
    IntrospectionController,
    TokensController,
    NativeCompletionController,
    OpenAICompletionController,
    ChatController,
    UnsupportedController,
]
# As llama-server: any origin may call (the API key, not the origin, is the gate); browsers may
# read the request id.
CORS = CORSConfig(allow_origins=["*"], expose_headers=[REQUEST_ID])


def with_head(controllers: list[type[Controller]]) -> None:
    """HEAD on every GET route: the GET handler answers and uvicorn sends its headers only.

    Added after decoration because Litestar refuses a body on handlers declared for HEAD.
    """
    for controller in controllers:
        for handler in vars(controller).values():
            if isinstance(handler, HTTPRouteHandler) and "GET" in handler.http_methods:
                handler.http_methods.add("HEAD")


def create_app(engine: Engine) -> Litestar:
    """The app takes its engine as an argument: the listener comes up at once while the engine
    loads models on its own thread, answering 503 until they are ready."""
    with_head(CONTROLLERS)
    app = Litestar(
        route_handlers=CONTROLLERS,
        dependencies={"engine": Provide(provide_engine, sync_to_thread=False)},
        exception_handlers=HANDLERS,
        guards=[require_api_key],
        lifespan=[engine_lifespan(engine)],
        openapi_config=openapi_config(),
        request_class=StrictJsonRequest,
        request_max_body_size=engine.settings.server.max_body_bytes,
        cors_config=CORS,
    )
    app.state.engine = EngineView(engine)
    app.state.settings = engine.settings
    return app
