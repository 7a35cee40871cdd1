"""uvicorn's httptools protocol, with its own errors in our envelope and our JSON log.

A request httptools cannot parse never reaches the app: uvicorn answers it with a plain-text
400 and logs a plain-text warning. This subclass answers with the error envelope and logs the
warning as a JSON line (`http_protocol_warning`) instead.
"""

from __future__ import annotations

import logging
from typing import Any

import structlog
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from app.server.errors import envelope_body


class EnvelopeHttpToolsProtocol(HttpToolsProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.logger = JsonWarnings(self.logger, self)  # type: ignore[assignment]

    def send_400_response(self, msg: str) -> None:
        body = envelope_body(400, msg)
        head = [STATUS_LINE[400]]
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
        self.transport.close()


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
        structlog.get_logger("mlxcel.http").warning(
            "http_protocol_warning",
            message=msg % args if args else msg,
            client=f"{client[0]}:{client[1]}" if client else None,
        )
