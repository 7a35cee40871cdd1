"""CORS preflights answer 200, as llama-server's do.

Litestar's CORS middleware answers a preflight (OPTIONS with `Origin` and
`Access-Control-Request-Method`) 204 and echoes the requested headers; llama-server answers 200,
and clients and test suites written against it check for 200. A plain OPTIONS (no preflight)
keeps its 204 with `Allow`.
"""

from __future__ import annotations

from litestar.types import ASGIApp, Message, Receive, Scope, Send

PREFLIGHT_HEADERS = (b"origin", b"access-control-request-method")


class PreflightOk:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope["headers"]) if scope["type"] == "http" else {}
        if scope.get("method") != "OPTIONS" or not all(name in headers for name in PREFLIGHT_HEADERS):
            await self.app(scope, receive, send)
            return

        async def answered_ok(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 204:
                message = {**message, "status": 200}
            await send(message)

        await self.app(scope, receive, answered_ok)
