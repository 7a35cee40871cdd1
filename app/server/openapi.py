"""The OpenAPI schema at /schema/openapi.json and its docs page at /schema: Litestar derives the
schema from the request and response Structs."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence

from litestar import Request, Router
from litestar._openapi.plugin import handle_schema_path_not_found
from litestar.exceptions import NotFoundException
from litestar.handlers import HTTPRouteHandler
from litestar.openapi import OpenAPIConfig, ResponseSpec
from litestar.openapi.plugins import JsonRenderPlugin, SwaggerRenderPlugin

from app import __version__
from app.server.engine_view import require_ready
from app.server.errors import ErrorEnvelope


def openapi_config() -> OpenAPIConfig:
    """Public like /health (the schema tells nothing a client could not read in docs/server.md).

    The page at /schema is Swagger UI: the server sends the HTML, the browser fetches Swagger
    UI's script from its CDN, so the page needs a browser online; the JSON never does.
    """
    docs = Router(
        "/schema",
        route_handlers=[],
        include_in_schema=False,
        opt={"public": True},
        before_request=not_found_in_envelope,
    )
    plugins = [SwaggerRenderPlugin(path="/"), JsonRenderPlugin()]
    return OpenAPIConfig(title="mlxcel", version=__version__, render_plugins=plugins, openapi_router=docs)


def not_found_in_envelope(request: Request) -> None:
    """Litestar answers a /schema/ path no plugin serves with an HTML page of its own; this
    server's 404 is the envelope, as on every other path."""
    if request.route_handler.fn is handle_schema_path_not_found:
        raise NotFoundException()


def streamed_or(body: type, stream: str) -> dict[int, ResponseSpec]:
    """The 200 of a route that answers `body` as JSON, or SSE frames with `"stream": true`.

    The handler returns a Response or a Stream, which says nothing about the body; this names it.
    """
    description = f"{body.__name__}; with `stream: true`, text/event-stream frames: {stream}"
    return {200: ResponseSpec(data_container=body, description=description, generate_examples=False)}


def error(description: str, shape: type = ErrorEnvelope) -> ResponseSpec:
    return ResponseSpec(data_container=shape, description=description, generate_examples=False)


def error_responses(
    handler: HTTPRouteHandler, guards: Sequence[object], shape: type = ErrorEnvelope
) -> dict[int, ResponseSpec]:
    """The errors a route can answer, in the envelope, read off what the route is: refused (501),
    gated by the key (401), taking a body or path parameters (400, 413), needing the engine (503).
    Litestar would otherwise document its own validation-error shape, which this server never sends.
    `guards` are the handler's and its controller's; `shape` the error body (Ollama's routes have their own)."""
    shaped = functools.partial(error, shape=shape)
    responses: dict[int, ResponseSpec] = {}
    takes_body = "data" in inspect.signature(handler.fn).parameters
    if takes_body or any("{" in path for path in handler.paths):
        responses[400] = shaped("a malformed body, a bad field or parameter (the message names it)")
    if takes_body:
        responses[413] = shaped("a body larger than server.max_body_bytes")
    if not handler.opt.get("public"):
        responses[401] = shaped("with API keys set: no key, or none of them")
    if require_ready in guards:
        responses[503] = shaped("models still loading, the server draining or failed, or the queue full")
    if handler.status_code == 501:
        responses[501] = shaped("not served here; the message says why")
    return responses
