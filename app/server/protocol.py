"""uvicorn's httptools protocol, bounded, with its own errors in our envelope and our JSON log.

uvicorn's httptools mode honours `timeout_keep_alive` (an idle connection between requests) and
nothing else that bounds a connection: a client may take forever over its headers or its body,
send headers without end (httptools keeps a line until it ends), or open sockets until the
process runs out of descriptors (2,100 slow sockets left every client, `/health` too, with a
connection reset and nothing in the log). This subclass adds, per connection:

- the request's head (request line and headers) within `server.max_header_bytes` and
  `server.max_headers`, else 431; within `server.header_timeout_s` of its first byte (or of the
  connection), else 408;
- the body within `server.body_timeout_s` of the head, else 408 (or the connection closed, once
  an answer has started);
- at most `server.max_connections` connections (lowered below the descriptor limit at startup,
  `connection_cap`): past it, the oldest connection that is idle or still sending its head is
  closed to make room, as nginx reuses its idle connections; with none such, the new connection
  gets a 503 and is closed.

A request httptools cannot parse never reaches the app: uvicorn answers it with a plain-text
400 and logs a plain-text warning; here the answer is the error envelope and the warning a JSON
line (`http_protocol_warning`). The limits' refusals log `http_limit` lines, at most one a
second per kind with the count since the last, so an attack cannot flood the log.
"""

from __future__ import annotations

import logging
import resource
import time
from asyncio import TimerHandle, Transport
from dataclasses import dataclass
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from app.events import http as events
from app.profiles.schema import ServerSettings
from app.server.errors import envelope_body

FD_RESERVE = 64  # descriptors kept for everything but client connections (models, logs, the grammar worker)


@dataclass(frozen=True)
class ListenerLimits:
    max_connections: int
    max_header_bytes: int
    max_headers: int
    header_timeout_s: float
    body_timeout_s: float

    @classmethod
    def of(cls, server: ServerSettings, max_connections: int) -> ListenerLimits:
        return cls(
            max_connections, server.max_header_bytes, server.max_headers, server.header_timeout_s, server.body_timeout_s
        )


def connection_cap(wanted: int) -> int:
    """`wanted` connections, or as many as the descriptor limit leaves room for beside FD_RESERVE.

    The soft limit is raised towards the hard one first where it is lower than needed."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = wanted + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < needed:
        raised = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, soft - FD_RESERVE))


class RequestRefused(Exception):  # noqa: N818 (a refusal, raised to stop the parser; not an error of ours)
    """Raised in a parser callback to stop parsing: the request broke a limit."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Notes:
    """`http_limit` warnings, at most one a second per kind, each with the count since the last."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._since: dict[str, int] = {}

    def note(self, kind: str, **fields: object) -> None:
        now = time.monotonic()
        self._since[kind] = self._since.get(kind, 0) + 1
        if now - self._last.get(kind, -1.0) >= 1.0:
            events.http_limit(kind=kind, count=self._since.pop(kind), **fields)
            self._last[kind] = now


NOTES = Notes()


class EnvelopeHttpToolsProtocol(HttpToolsProtocol):
    limits: ListenerLimits  # set by `bounded_protocol` (the class uvicorn instantiates)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.logger = JsonWarnings(self.logger, self)  # type: ignore[assignment]
        self.waiting_since: float | None = time.monotonic()  # idle, or sending its head, since then
        self._in_head = True  # between a request's first byte (or the connection's start) and its headers' end
        self._head_bytes = 0  # the bytes received while in the head (a line httptools still holds among them)
        self._head_size = 0  # the request line's and the whole headers' bytes
        self._head_timer: TimerHandle | None = None
        self._body_timer: TimerHandle | None = None

    # --- connections --------------------------------------------------------------------------

    def connection_made(self, transport: Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer = self._later(self.limits.header_timeout_s, self._head_overdue)
        if len(self.connections) <= self.limits.max_connections:
            return
        waiting = [c for c in self.connections if c is not self and getattr(c, "waiting_since", None) is not None]
        if waiting:
            oldest = min(waiting, key=lambda c: c.waiting_since)
            oldest.transport.close()
            NOTES.note(
                "connections_full", action="closed the oldest idle connection", limit=self.limits.max_connections
            )
            return
        NOTES.note("connections_full", action="refused with 503", limit=self.limits.max_connections)
        self._answer(503, f"this server holds {self.limits.max_connections} connections (server.max_connections)")

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._unset_keepalive_if_required()
        if self._in_head:
            self._head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, RequestRefused):
                self._refuse(exc.__context__)
            else:
                self._malformed()
            return
        except httptools.HttpParserError:
            self._malformed()
            return
        except httptools.HttpParserUpgrade:
            self._unsupported_upgrade_warning()
            return
        if self._in_head and self._head_bytes > self.limits.max_header_bytes:
            self._refuse(RequestRefused(431, self._head_too_large()))

    # --- the head and the body -----------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._head_bytes, self._head_size = True, 0, 0
        if self._head_timer is None:
            self._head_timer = self._later(self.limits.header_timeout_s, self._head_overdue)

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        self._grew(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        self._grew(len(name) + len(value) + 4)  # ": " and the line's end
        if len(self.headers) > self.limits.max_headers:
            raise RequestRefused(
                431, f"the request has more than {self.limits.max_headers} headers (server.max_headers)"
            )

    def _grew(self, size: int) -> None:
        self._head_size += size
        if self._head_size > self.limits.max_header_bytes:
            raise RequestRefused(431, self._head_too_large())

    def on_headers_complete(self) -> None:
        self._in_head = False
        self.waiting_since = None
        self._cancel(self._head_timer)
        self._head_timer = None
        self._body_timer = self._later(self.limits.body_timeout_s, self._body_overdue)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._cancel(self._body_timer)
        self._body_timer = None
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.pipeline and not self.transport.is_closing():  # idle until the next request
            self.waiting_since = time.monotonic()

    def _head_too_large(self) -> str:
        return f"the request's head is larger than {self.limits.max_header_bytes} bytes (server.max_header_bytes)"

    def _head_overdue(self) -> None:
        self._head_timer = None
        seconds = self.limits.header_timeout_s
        NOTES.note("header_timeout", client=self._client(), seconds=seconds)
        self._answer(408, f"the request's head took longer than {seconds:g} s (server.header_timeout_s)")

    def _body_overdue(self) -> None:
        self._body_timer = None
        seconds = self.limits.body_timeout_s
        NOTES.note("body_timeout", client=self._client(), seconds=seconds)
        self._answer(408, f"the request's body took longer than {seconds:g} s (server.body_timeout_s)")

    # --- answers --------------------------------------------------------------------------------

    def _refuse(self, refusal: RequestRefused) -> None:
        NOTES.note("head_too_large", client=self._client(), reason=str(refusal))
        self._answer(refusal.status, str(refusal))

    def _malformed(self) -> None:
        msg = "Invalid HTTP request received."
        self.logger.warning(msg)
        self.send_400_response(msg)

    def send_400_response(self, msg: str) -> None:
        self._answer(400, msg)

    def _answer(self, status: int, message: str) -> None:
        """Answer `status` in the envelope unless a response is under way, then close."""
        if self.transport.is_closing():
            return
        if self.cycle is None or self.cycle.response_complete or not self.cycle.response_started:
            body = envelope_body(status, message)
            head = [STATUS_LINE[status]]
            for name, value in self.server_state.default_headers:
                head.extend([name, b": ", value, b"\r\n"])
            head.extend(
                [
                    b"content-type: application/json\r\n",
                    b"content-length: " + str(len(body)).encode("ascii") + b"\r\n",
                    b"connection: close\r\n",
                    b"\r\n",
                ]
            )
            self.transport.write(b"".join(head) + body)
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True  # the app reads a disconnect, and its own answer goes nowhere
            self.cycle.message_event.set()
        self.transport.close()

    # --- helpers --------------------------------------------------------------------------------

    def _later(self, seconds: float, callback: Any) -> TimerHandle:
        return self.loop.call_later(seconds, callback)

    @staticmethod
    def _cancel(timer: TimerHandle | None) -> None:
        if timer is not None:
            timer.cancel()

    def _cancel_timers(self) -> None:
        self._cancel(self._head_timer)
        self._cancel(self._body_timer)
        self._head_timer = self._body_timer = None

    def _client(self) -> str | None:
        return f"{self.client[0]}:{self.client[1]}" if self.client else None


def bounded_protocol(server: ServerSettings, max_connections: int) -> type[EnvelopeHttpToolsProtocol]:
    """The protocol class uvicorn makes for each connection, with the profile's listener limits."""
    limits = ListenerLimits.of(server, max_connections)
    return type("BoundedHttpToolsProtocol", (EnvelopeHttpToolsProtocol,), {"limits": limits})


class JsonWarnings:
    """uvicorn's connection logger, except that warnings (unparseable requests, refused upgrades,
    the concurrency limit) become JSON lines naming the client."""

    def __init__(self, inner: logging.Logger, protocol: HttpToolsProtocol) -> None:
        self._inner = inner
        self._protocol = protocol

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def warning(self, msg: str, *args: Any, **_: Any) -> None:
        client = self._protocol.client
        events.http_protocol_warning(
            message=msg % args if args else msg,
            client=f"{client[0]}:{client[1]}" if client else None,
        )
