"""The request id and the access event: one `http_request` line per HTTP request, every route,
every status (4xx and the readiness 503s included).

ASGI layers around the Litestar app, outside its routing so that a path no route matches is
logged too: asgi-correlation-id takes the client's `X-Request-ID` (or makes one) and echoes it on
the response; `AccessLog` times the request, notes its status and the tokens its rows counted,
and writes the event (status 499 for a client that left mid-body); inside it, the Host check
(app/server/hosts.py). Handlers reach the ids and counts through context variables, which the
tasks a request starts inherit.
"""

from __future__ import annotations

import re
import time
import uuid
from contextvars import ContextVar
from dataclasses import dataclass

from asgi_correlation_id import CorrelationIdMiddleware, correlation_id
from litestar import Litestar
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from app.events import http as events
from app.server.hosts import HostCheck
from app.server.metrics import HttpMetrics
from app.server.preflight import PreflightOk

REQUEST_ID_HEADER = "x-request-id"
# A client's id is kept when it is short visible ASCII (a UUID, a trace id, "job-42/3"); any other
# value is replaced by a fresh id, with a warning naming the new one.
CLIENT_ID = re.compile(r"[\x21-\x7e]{1,128}")
# nginx's "client closed request": the client left before its body was whole, so whatever the
# app then answered reached no one and says nothing about the server (it is not a 5xx).
CLIENT_CLOSED = 499


def request_id() -> str:
    """This request's id: the client's X-Request-ID when it gave a usable one."""
    return correlation_id.get() or new_request_id()


def new_request_id() -> str:
    return uuid.uuid4().hex[:16]


@dataclass
class Usage:
    """Tokens the request's rows counted, summed over its rows."""

    prompt_n: int = 0
    predicted_n: int = 0


_usage: ContextVar[Usage | None] = ContextVar("mlxcel_request_usage", default=None)


def count_tokens(prompt_n: int, predicted_n: int) -> None:
    """A row of this request finished: its prompt and emitted tokens go into the access event."""
    usage = _usage.get()
    if usage is not None:
        usage.prompt_n += prompt_n
        usage.predicted_n += predicted_n


class AccessLog:
    """The access event of each request `serve` (the app, or layers around it) answers."""

    def __init__(self, app: Litestar, serve: ASGIApp) -> None:
        self.app = app
        self.serve = serve
        self.metrics: HttpMetrics = app.state.http_metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.serve(scope, receive, send)
            return
        started = time.perf_counter()
        usage = Usage()
        token = _usage.set(usage)
        status = 500  # what uvicorn answers when the app raised before starting a response
        body_whole = False  # the last part of the request body arrived
        body_cut = False  # the client disconnected before it did

        async def noting_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        async def noting_body() -> Message:
            nonlocal body_whole, body_cut
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                body_whole = True
            elif message["type"] == "http.disconnect" and not body_whole:
                body_cut = True
            return message

        try:
            await self.serve(scope, noting_body, noting_status)
        finally:
            _usage.reset(token)
            if body_cut:
                status = CLIENT_CLOSED
            seconds = time.perf_counter() - started
            route = scope.get("path_template") or None  # None: no route matched the path
            self.metrics.observe(route, status)
            events.http_request(
                request_id=correlation_id.get(),
                method=scope["method"],
                path=scope["path"],
                route=route,
                status=status,
                duration_ms=seconds * 1000.0,
                prompt_n=usage.prompt_n,
                predicted_n=usage.predicted_n,
                profile=self.app.state.settings.profile,
                tenant=scope.get("state", {}).get("tenant"),  # the auth guard's (app/server/auth.py), never the key
                model=scope.get("state", {}).get("model"),  # the router's name (app/server/engine_view.py)
            )


def with_access_log(app: Litestar) -> ASGIApp:
    """The app as uvicorn serves it: request ids outermost, then the access event, then the Host
    check, then preflights answered 200."""
    return CorrelationIdMiddleware(  # type: ignore[return-value]
        AccessLog(app, HostCheck(app, PreflightOk(app))),  # type: ignore[arg-type]
        header_name=REQUEST_ID_HEADER,
        generator=new_request_id,
        validator=CLIENT_ID.fullmatch,
    )
