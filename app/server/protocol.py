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
- trailers (the fields after a chunked body's last chunk) within the same head limits: their
  fields count with the head's, and bytes that complete nothing (an unfinished trailer line)
  within `server.max_header_bytes`, else 431, so httptools' joining of an unfinished line stays
  bounded;
- a WebSocket upgrade answered 426 and closed (no route serves one; uvicorn would hand the socket
  to nothing and leave it open); any other `Upgrade` is ignored, as HTTP allows: the request is
  served, then the connection closed (the parser reads nothing after an upgrade);
- an answer's unsent bytes (asyncio's write buffer: one message at most, as uvicorn waits for it
  to drain before the next, so a body within `server.max_response_bytes` or a stream's frames)
  taken by the client within `server.write_timeout_s`: a connection whose buffer went down by
  nothing that long, its answer paused by asyncio's flow control or done, is aborted
  (`transport.abort()`: a polite `close()` waits for a flush that never comes), which a running
  request reads as its client leaving, so a stalled stream's row is cancelled; and past
  `server.max_unsent_bytes` over every connection, the longest stalled are aborted;
- at most `server.max_connections` connections (lowered below the descriptor limit at startup,
  `connection_cap`): past it, the oldest connection that is idle, still sending its head, or
  stalled on its writes is closed to make room (aborted where it holds unsent bytes), as nginx
  reuses its idle connections; with none such, the new connection gets a 503 and is closed.

A request httptools cannot parse never reaches the app: uvicorn answers it with a plain-text
400 and logs a plain-text warning; here the answer is the error envelope and the warning a JSON
line (`http_protocol_warning`). The limits' refusals log `http_limit` lines, at most one a
second per kind with the count since the last, so an attack cannot flood the log.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import resource
import socket
import struct
import sys
import termios
import time
from asyncio import TimerHandle, Transport
from dataclasses import dataclass
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from app.events import http as events
from app.profiles.schema import ServerSettings
from app.runtime.memory import release_free_memory
from app.server.errors import envelope_body

SO_NWRITE = 0x1024  # macOS: the bytes a socket's send queue holds (not in Python's socket module)
RECLAIM_S = 0.5  # after the last abort: the request it cancelled has let go of its memory
FD_RESERVE = 64  # descriptors kept for everything but client connections (models, logs, the grammar worker)


@dataclass(frozen=True)
class ListenerLimits:
    max_connections: int
    max_header_bytes: int
    max_headers: int
    header_timeout_s: float
    body_timeout_s: float
    write_timeout_s: float
    max_unsent_bytes: int

    @classmethod
    def of(cls, server: ServerSettings, max_connections: int) -> ListenerLimits:
        return cls(
            max_connections,
            server.max_header_bytes,
            server.max_headers,
            server.header_timeout_s,
            server.body_timeout_s,
            server.write_timeout_s,
            server.max_unsent_bytes,
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


class Reclaim:
    """Free memory handed back to the system (app/runtime/memory.py) RECLAIM_S after the last
    abort, off the loop: an aborted answer's buffer and a stalled stream's queued frames are freed
    by then, and glibc kept them (about 20 MB after eight unread answers of 1.9 MB)."""

    def __init__(self) -> None:
        self._timer: TimerHandle | None = None

    def soon(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_later(RECLAIM_S, self._run, loop)

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        loop.run_in_executor(None, release_free_memory)


RECLAIM = Reclaim()


class EnvelopeHttpToolsProtocol(HttpToolsProtocol):
    limits: ListenerLimits  # set by `bounded_protocol` (the class uvicorn instantiates)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.logger = JsonWarnings(self.logger, self)  # type: ignore[assignment]
        self.waiting_since: float | None = time.monotonic()  # idle, or sending its head, since then
        self._in_head = True  # between a request's first byte (or the connection's start) and its headers' end
        self._head_bytes = 0  # the bytes received while in the head (a line httptools still holds among them)
        self._head_size = 0  # the request line's and the whole headers' bytes
        self._unparsed = 0  # the bytes received after the head that completed nothing (trailers, chunk framing)
        self._head_timer: TimerHandle | None = None
        self._body_timer: TimerHandle | None = None
        self._write_timer: TimerHandle | None = None
        self.stalled_since: float | None = None  # holding unsent bytes: when the client last took some
        self._unsent_at_check = 0
        self._drained = False  # asyncio resumed writing since the last check

    # --- connections --------------------------------------------------------------------------

    def connection_made(self, transport: Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer = self._later(self.limits.header_timeout_s, self._head_overdue)
        if len(self.connections) <= self.limits.max_connections:
            return
        evictable = [c for c in self.connections if c is not self and c.evictable_since() is not None]
        if evictable:
            min(evictable, key=lambda c: c.evictable_since()).evict()
            NOTES.note(
                "connections_full",
                action="closed the oldest idle or stalled connection",
                limit=self.limits.max_connections,
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
        else:
            self._unparsed += len(data)  # set back by every body piece and field httptools completes
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
            self._after_upgrade()
            return
        if self._in_head and self._head_bytes > self.limits.max_header_bytes:
            self._refuse(RequestRefused(431, self._head_too_large()))
        elif not self._in_head and self._unparsed > self.limits.max_header_bytes:
            self._refuse(RequestRefused(431, self._trailers_too_large()))

    def evictable_since(self) -> float | None:
        """Since when this connection is idle or sending its head, or, holding unsent bytes, since
        its client last took some (None: busy, or going)."""
        unsent = self.transport.get_write_buffer_size()
        if self.transport.is_closing() and not unsent:
            return None  # closed, or aborted: connection_lost is on its way
        return self.stalled_since if unsent else self.waiting_since

    def evict(self) -> None:
        """Make room: closed, or aborted where its client has not taken what was sent."""
        if self.transport.get_write_buffer_size():
            self.abort()
        else:
            self.transport.close()

    def abort(self) -> None:
        """Closed at once, its unsent bytes dropped; the memory they and the request held goes back soon."""
        self.transport.abort()
        RECLAIM.soon(self.loop)

    # --- upgrades -------------------------------------------------------------------------------

    def _should_upgrade(self) -> bool:
        """A WebSocket handshake: refused with 426 (below), never handed to the app or to uvicorn's
        websocket protocol. Other upgrades are served as plain requests."""
        return self._get_upgrade() == b"websocket"

    def _after_upgrade(self) -> None:
        """httptools parses nothing after an upgrade request: the connection ends with its answer."""
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.keep_alive = False
        elif not self.transport.is_closing():
            self.transport.close()

    # --- the head and the body -----------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._head_bytes, self._head_size, self._unparsed = True, 0, 0, 0
        if self._head_timer is None:
            self._head_timer = self._later(self.limits.header_timeout_s, self._head_overdue)

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        self._grew(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        self._unparsed = 0
        self._grew(len(name) + len(value) + 4)  # ": " and the line's end (a trailer's too, after the head's)
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

    def on_body(self, body: bytes) -> None:
        self._unparsed = 0
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._cancel(self._body_timer)
        self._body_timer = None
        self._unparsed = 0
        if self.parser.should_upgrade() and self._should_upgrade():
            NOTES.note("upgrade_refused", client=self._client())
            self._answer(426, "this server serves no WebSocket route; send the request without Upgrade")
            return
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.pipeline and not self.transport.is_closing():  # idle until the next request
            self.waiting_since = time.monotonic()
        self._watch_writes()

    def _head_too_large(self) -> str:
        return f"the request's head is larger than {self.limits.max_header_bytes} bytes (server.max_header_bytes)"

    def _trailers_too_large(self) -> str:
        return f"the request's trailers are larger than {self.limits.max_header_bytes} bytes (server.max_header_bytes)"

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

    # --- writes ---------------------------------------------------------------------------------

    def pause_writing(self) -> None:
        super().pause_writing()
        self._watch_writes()
        self._within_unsent_total()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._drained = True
        if self.stalled_since is not None:
            self.stalled_since = time.monotonic()

    def _watch_writes(self) -> None:
        """Check every `write_timeout_s`, while bytes are unsent, that the client took some."""
        if self._write_timer is not None or not self.transport.get_write_buffer_size():
            return
        self.stalled_since = time.monotonic()
        self._unsent_at_check, self._drained = self._unsent_in_all(), False
        self._write_timer = self._later(self.limits.write_timeout_s, self._check_writes)

    def _check_writes(self) -> None:
        self._write_timer = None
        if not self.transport.get_write_buffer_size():
            self.stalled_since = None
            return
        unsent = self._unsent_in_all()
        if unsent < self._unsent_at_check or self._drained:  # the client reads, if slowly
            self.stalled_since = time.monotonic()
        elif not self._answer_growing():
            seconds = self.limits.write_timeout_s
            NOTES.note("write_timeout", client=self._client(), seconds=seconds, reason=f"{unsent} bytes unsent")
            self.abort()
            return
        self._unsent_at_check, self._drained = unsent, False
        self._write_timer = self._later(self.limits.write_timeout_s, self._check_writes)

    def _unsent_in_all(self) -> int:
        """The bytes the client has not taken: asyncio's buffer and the kernel's send queue. The
        kernel's alone says that a slow reader reads: its queue (megabytes) shrinks with every
        read, where asyncio's buffer moves only once the kernel has room for a good part of it."""
        return self.transport.get_write_buffer_size() + kernel_send_queue(self.transport)

    def _answer_growing(self) -> bool:
        """Whether an answer under way may still add bytes (asyncio has not paused it): then unsent
        bytes that did not go down are no verdict, as the client may have taken some meanwhile."""
        under_way = self.cycle is not None and not self.cycle.response_complete
        return under_way and not self.flow.write_paused and not self.transport.is_closing()

    def _within_unsent_total(self) -> None:
        """Past `max_unsent_bytes` over every connection, abort the longest stalled until within it."""
        unsent = {c: c.transport.get_write_buffer_size() for c in self.connections}
        total = sum(unsent.values())
        if total <= self.limits.max_unsent_bytes:
            return
        stalled = sorted(
            (c for c in unsent if c.stalled_since is not None and unsent[c]), key=lambda c: c.stalled_since
        )
        for connection in stalled:
            NOTES.note(
                "unsent_full", action="aborted the longest stalled connection", limit=self.limits.max_unsent_bytes
            )
            connection.abort()
            total -= unsent[connection]
            if total <= self.limits.max_unsent_bytes:
                return

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
        self._watch_writes()  # a client that reads nothing does not keep the closing connection

    # --- helpers --------------------------------------------------------------------------------

    def _later(self, seconds: float, callback: Any) -> TimerHandle:
        return self.loop.call_later(seconds, callback)

    @staticmethod
    def _cancel(timer: TimerHandle | None) -> None:
        if timer is not None:
            timer.cancel()

    def _cancel_timers(self) -> None:
        for timer in (self._head_timer, self._body_timer, self._write_timer):
            self._cancel(timer)
        self._head_timer = self._body_timer = self._write_timer = None

    def _client(self) -> str | None:
        return f"{self.client[0]}:{self.client[1]}" if self.client else None


def kernel_send_queue(transport: Transport) -> int:
    """The bytes the kernel holds for a connection, not yet acknowledged by the client (Linux's
    SIOCOUTQ, macOS's SO_NWRITE); 0 where neither is known."""
    sock = transport.get_extra_info("socket")
    try:
        if sock is not None and sys.platform == "linux":
            return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]
        if sock is not None and sys.platform == "darwin":
            return sock.getsockopt(socket.SOL_SOCKET, SO_NWRITE)
    except OSError:
        pass
    return 0


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
