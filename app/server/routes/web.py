"""The chat page at `/` (app/server/web/index.html): one file shipped in the package, no build
step, nothing fetched from elsewhere. Off with `server.web_ui = false` (then `/` is a 404, as
an unserved path). The page is public, as llama-server's: it holds no data, and the calls it
makes need the API key when one is set (the page asks for it on a 401)."""

from __future__ import annotations

import functools
from pathlib import Path

from litestar import Controller, Request, Response, get
from litestar.exceptions import NotFoundException

WEB = Path(__file__).resolve().parents[1] / "web"
PAGE = WEB / "index.html"
ICON = WEB / "favicon.svg"


@functools.cache
def page() -> bytes:
    return PAGE.read_bytes()


@functools.cache
def icon() -> bytes:
    return ICON.read_bytes()


class WebController(Controller):
    tags = ("web",)

    @get("/", opt={"public": True}, include_in_schema=False, name="web-page")
    async def index(self, request: Request) -> Response:
        if not request.app.state.settings.server.web_ui:
            raise NotFoundException()
        return Response(page(), media_type="text/html; charset=utf-8", headers={"Cache-Control": "no-cache"})

    @get("/favicon.ico", opt={"public": True}, include_in_schema=False, name="web-icon")
    async def favicon(self, request: Request) -> Response:
        """The page's icon (an SVG, as the page's <link rel="icon"> says), where browsers ask for it."""
        if not request.app.state.settings.server.web_ui:
            raise NotFoundException()
        return Response(icon(), media_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"})
