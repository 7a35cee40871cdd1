"""The chat page at `/` (index.html beside this module): one file shipped in the package, no build
step, nothing fetched from elsewhere. Off with `server.web_ui = false` (then `/` is a 404, as
an unserved path). The page is public, as llama-server's: it holds no data, and the calls it
makes need the API key when one is set (the page asks for it on a 401).

It is sent with a Content-Security-Policy that runs only its own inline script and style (by
their hashes, worked out from the file once) and lets it call only this server, refuses to be
framed (`frame-ancestors 'none'`, and X-Frame-Options for older browsers), and `nosniff`."""

from __future__ import annotations

import base64
import functools
import hashlib
import re
from pathlib import Path

from litestar import Controller, MediaType, Request, Response, get
from litestar.exceptions import NotFoundException

WEB = Path(__file__).resolve().parent
PAGE = WEB / "index.html"
ICON = WEB / "favicon.svg"
INLINE = {tag: re.compile(rf"<{tag}[^>]*>(.*?)</{tag}>", re.DOTALL) for tag in ("script", "style")}


@functools.cache
def page() -> bytes:
    return PAGE.read_bytes()


@functools.cache
def icon() -> bytes:
    return ICON.read_bytes()


def hashes(tag: str, text: str) -> str:
    """CSP sources naming each inline `tag` block of the page by its SHA-256."""
    digests = (hashlib.sha256(block.encode()).digest() for block in INLINE[tag].findall(text))
    return " ".join(f"'sha256-{base64.b64encode(digest).decode()}'" for digest in digests) or "'none'"


@functools.cache
def headers() -> dict[str, str]:
    text = page().decode()
    policy = (
        f"default-src 'none'; script-src {hashes('script', text)}; style-src {hashes('style', text)}; "
        "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
    return {
        "Cache-Control": "no-cache",
        "Content-Security-Policy": policy,
        "X-Frame-Options": "DENY",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
    }


class WebController(Controller):
    tags = ("web",)

    @get("/", opt={"public": True}, include_in_schema=False, name="web-page")
    async def index(self, request: Request) -> Response:
        if not request.app.state.settings.server.web_ui:
            raise NotFoundException()
        return Response(page(), media_type=MediaType.HTML, headers=headers())

    @get("/favicon.ico", opt={"public": True}, include_in_schema=False, name="web-icon")
    async def favicon(self, request: Request) -> Response:
        """The page's icon (an SVG, as the page's <link rel="icon"> says), where browsers ask for it."""
        if not request.app.state.settings.server.web_ui:
            raise NotFoundException()
        headers = {"Cache-Control": "max-age=86400", "X-Content-Type-Options": "nosniff"}
        return Response(icon(), media_type="image/svg+xml", headers=headers)
