"""CORS as llama-server answers it: preflights 200, and `*` on every answer under a wildcard.

Litestar's CORS middleware answers a preflight (OPTIONS with `Origin` and
`Access-Control-Request-Method`) 204 and echoes the requested headers; llama-server answers 200,
and clients and test suites written against it check for 200. A plain OPTIONS (no preflight)
keeps its 204 with `Allow`.

Under `server.cors_origins = ["*"]` Litestar reflects a request's own `Origin` (with `Vary:
Origin`) on a simple request that carries a cookie, where the preflight said `*`. This server
reads no cookies and allows no credentials under the wildcard, so every answer says `*`, as the
preflight does and as llama-server's default `--cors-origins "*"` does.
"""

from __future__ import annotations

from litestar import Litestar
from litestar.datastructures import MutableScopeHeaders
from litestar.types import Message, Receive, Scope, Send

PREFLIGHT_HEADERS = (b"origin", b"access-control-request-method")
ALLOW_ORIGIN = "access-control-allow-origin"


class PreflightOk:
    def __init__(self, app: Litestar) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope["headers"]) if scope["type"] == "http" else {}
        if scope.get("method") == "OPTIONS" and all(name in headers for name in PREFLIGHT_HEADERS):

            async def answered_ok(message: Message) -> None:
                if message["type"] == "http.response.start" and message["status"] == 204:
                    message = {**message, "status": 200}
                await send(message)

            await self.app(scope, receive, answered_ok)
        elif b"origin" in headers and self.app.state.settings.server.cors_origins == ["*"]:

            async def any_origin(message: Message) -> None:
                if message["type"] == "http.response.start":
                    answered = MutableScopeHeaders.from_message(message)
                    if ALLOW_ORIGIN in answered and answered[ALLOW_ORIGIN] != "*":
                        answered[ALLOW_ORIGIN] = "*"
                        if answered.get("vary", "").lower() == "origin":
                            del answered["vary"]
                await send(message)

            await self.app(scope, receive, any_origin)
        else:
            await self.app(scope, receive, send)
