"""The Litestar application: controllers, the engine dependency, the error envelope and the lifespan."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from litestar import Controller, Litestar
from litestar.config.cors import CORSConfig
from litestar.di import Provide
from litestar.handlers import HTTPRouteHandler

from app.server import offload
from app.server.access import REQUEST_ID_HEADER
from app.server.anthropic.routes import MessagesController
from app.server.auth import require_api_key
from app.server.body import StrictJsonRequest
from app.server.core.grammars import Grammars
from app.server.core.shaping import RULE_HEADER
from app.server.embeddings.routes import EmbeddingsController
from app.server.engine_view import Engine, EngineSwitch, Reloader, Router, engine_lifespan, provide_engine
from app.server.errors import HANDLERS, ErrorEnvelope
from app.server.metrics import HttpMetrics
from app.server.native.routes import (
    AdminController,
    IntrospectionController,
    NativeCompletionController,
    TokensController,
    UnsupportedController,
)
from app.server.ollama.routes import OllamaController, OllamaManagementController
from app.server.openai.routes import ChatController, ModelsController, OpenAICompletionController
from app.server.openapi import error_responses, openapi_config
from app.server.responses.routes import ResponsesController
from app.server.responses.store import ResponseStore
from app.server.web.page import WebController

CONTROLLERS: list[type[Controller]] = [
    IntrospectionController,
    ModelsController,
    TokensController,
    NativeCompletionController,
    OpenAICompletionController,
    ChatController,
    MessagesController,
    ResponsesController,
    EmbeddingsController,
    OllamaController,
    OllamaManagementController,
    UnsupportedController,
    AdminController,
    WebController,
]


def cors(origins: list[str]) -> CORSConfig | None:
    """CORS for GET and POST, any header; browsers may read the request id and the acceptance
    rule. `server.cors_origins` = ["*"] (the default) answers `Access-Control-Allow-Origin: *`
    without credentials: any page may call, as it could call any public API, but never with the
    browser's credentials for this server. Listed origins (no "*" among them: the profile check
    refuses the mix) get their origin reflected and credentials allowed. An empty list turns CORS off.
    """
    if not origins:
        return None
    return CORSConfig(
        allow_origins=origins,
        allow_credentials="*" not in origins,
        allow_methods=["GET", "POST"],
        allow_headers=["*"],
        expose_headers=[REQUEST_ID_HEADER, RULE_HEADER],
    )


def finish_handlers(controllers: list[type[Controller]]) -> None:
    """HEAD on every GET route: the GET handler answers and uvicorn sends its headers only; and
    the error envelope documented for every error a route can answer (openapi.error_responses).

    HEAD is added after decoration because Litestar refuses a body on handlers declared for HEAD.
    """
    for controller in controllers:
        for handler in vars(controller).values():
            if not isinstance(handler, HTTPRouteHandler):
                continue
            if "GET" in handler.http_methods:
                handler.http_methods.add("HEAD")
            guards = [*(vars(controller).get("guards") or ()), *(handler.guards or ())]
            shape = vars(controller).get("error_body", ErrorEnvelope)  # Ollama's routes: {"error": "..."}
            handler.responses = error_responses(handler, guards, shape) | (handler.responses or {})


def grammar_lifespan(grammars: Grammars) -> Callable[[Litestar], AbstractAsyncContextManager[None]]:
    """The grammar worker process lives while the app does; shutdown closes its pipe (it exits)."""

    @asynccontextmanager
    async def run(_: Litestar) -> AsyncIterator[None]:
        try:
            yield
        finally:
            grammars.close()

    return run


def create_app(engine: Engine | EngineSwitch | Router, reloader: Reloader | None = None) -> Litestar:
    """The app takes its engine as an argument: the listener comes up at once while the engine
    loads models on its own thread, answering 503 until they are ready. With a `reloader` (on
    the same EngineSwitch), POST /admin/reload can swap in a new engine when the profile allows it.
    A Router serves many profiles, each loaded on its first request (app/engine/router.py)."""
    engines: EngineSwitch | None = None
    if isinstance(engine, Router):
        router, serving, settings, tenants = engine, engine, engine.settings, engine.tenants
    else:
        router, engines = None, engine if isinstance(engine, EngineSwitch) else EngineSwitch(engine)
        serving, settings, tenants = engines, engines.current.settings, engines.current.tenants
    finish_handlers(CONTROLLERS)
    grammars = Grammars()  # compiles requests' grammars in a worker process (started on the first)
    app = Litestar(
        route_handlers=CONTROLLERS,
        dependencies={"engine": Provide(provide_engine)},  # a generator: held until the handler returns
        exception_handlers=HANDLERS,
        guards=[require_api_key],
        lifespan=[engine_lifespan(serving), grammar_lifespan(grammars), offload.reclaim_lifespan()],
        openapi_config=openapi_config(),
        request_class=StrictJsonRequest,
        request_max_body_size=settings.server.max_body_bytes,
        cors_config=cors(settings.server.cors_origins),
        logging_config=None,  # Litestar's records reach the root handler of app/runtime/logging.py as they are
    )
    app.state.engines = engines
    app.state.router = router
    app.state.reloader = reloader
    app.state.settings = settings  # the live profile's: the API key and JSON depth follow a reload
    # its keys (a reload's engine read the key file again); a router's are its own profile's, fixed
    app.state.tenants = tenants
    app.state.grammars = grammars
    # /v1/responses kept for previous_response_id, each tenant's apart; outlives reloads
    app.state.responses = ResponseStore(settings.server.responses_stored, settings.server.responses_store_mb << 20)
    app.state.http_metrics = HttpMetrics()  # counted by the access log, read by /metrics; outlives reloads

    def follow(new: Engine) -> None:
        app.state.settings = new.settings
        app.state.tenants = new.tenants

    if engines is not None:
        engines.on_swap.append(follow)
    return app
