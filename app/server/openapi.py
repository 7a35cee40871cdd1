"""The OpenAPI schema at /schema/openapi.json: Litestar derives it from the request and response Structs."""

from __future__ import annotations

from litestar import Router
from litestar.openapi import OpenAPIConfig, ResponseSpec
from litestar.openapi.plugins import JsonRenderPlugin

from app import __version__


def openapi_config() -> OpenAPIConfig:
    """Public like /health (the schema tells nothing a client could not read in docs/server.md);
    JSON only, no documentation UI that would fetch scripts from a CDN."""
    docs = Router("/schema", route_handlers=[], include_in_schema=False, opt={"public": True})
    return OpenAPIConfig(title="mlxcel", version=__version__, render_plugins=[JsonRenderPlugin()], openapi_router=docs)


def streamed_or(body: type, stream: str) -> dict[int, ResponseSpec]:
    """The 200 of a route that answers `body` as JSON, or SSE frames with `"stream": true`.

    The handler returns a Response or a Stream, which says nothing about the body; this names it.
    """
    description = f"{body.__name__}; with `stream: true`, text/event-stream frames: {stream}"
    return {200: ResponseSpec(data_container=body, description=description, generate_examples=False)}
