"""llama-server's error envelope, for every error the server returns."""

from __future__ import annotations

import msgspec
from litestar import Request, Response
from litestar.exceptions import HTTPException, NotFoundException, ValidationException
from litestar.exceptions.http_exceptions import RequestEntityTooLarge
from litestar.status_codes import HTTP_500_INTERNAL_SERVER_ERROR
from msgspec import UNSET, UnsetType

from app.events import http as events
from app.runtime.logging import internal_error_message, new_error_id

TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    426: "invalid_request_error",
    431: "invalid_request_error",
    429: "unavailable_error",
    501: "not_supported_error",
    503: "unavailable_error",
}


SHOWN_CHARS = 100  # of a client's own string echoed in a message (a model name, a Host header)


def quoted(text: str | None) -> str:
    """A client's string as an error message shows it: repr-quoted, cut to SHOWN_CHARS characters
    (a body of megabytes may name a "model" of any length; the message names it, not copies it)."""
    if text is None:
        return "None"
    shown = repr(text[:SHOWN_CHARS])
    return shown if len(text) <= SHOWN_CHARS else f"{shown}... ({len(text)} characters)"


class ErrorDetail(msgspec.Struct, kw_only=True):
    code: int
    message: str
    type: str
    # exceed_context_size_error's counts, as llama-server sends them
    n_prompt_tokens: int | UnsetType = UNSET
    n_ctx: int | UnsetType = UNSET


class ErrorEnvelope(msgspec.Struct, kw_only=True):
    """Every error body; the OpenAPI schema names it for every error a route can answer."""

    error: ErrorDetail


class ApiError(Exception):
    """An error answered as `{"error": {"code", "message", "type"}}`."""

    def __init__(
        self,
        code: int,
        message: str,
        kind: str | None = None,
        counts: dict[str, int] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.kind = kind or TYPES.get(code, "server_error")
        self.counts = counts or {}  # ErrorDetail's optional counts (n_prompt_tokens, n_ctx)
        self.headers = headers  # a 503's Retry-After


def envelope_body(code: int, message: str, kind: str | None = None, counts: dict[str, int] | None = None) -> bytes:
    detail = ErrorDetail(code=code, message=message, type=kind or TYPES.get(code, "server_error"), **(counts or {}))
    return msgspec.json.encode(ErrorEnvelope(error=detail))


def envelope(
    code: int,
    message: str,
    kind: str | None = None,
    headers: dict[str, str] | None = None,
    counts: dict[str, int] | None = None,
) -> Response:
    return Response(
        content=envelope_body(code, message, kind, counts),
        status_code=code,
        media_type="application/json",
        headers=headers,
    )


def on_api_error(_: Request, exc: ApiError) -> Response:
    return envelope(exc.code, exc.message, exc.kind, exc.headers, exc.counts)


def on_validation_error(_: Request, exc: ValidationException) -> Response:
    details = exc.extra if isinstance(exc.extra, list) else []
    reasons = "; ".join(_reason(d) for d in details)
    return envelope(400, f"{exc.detail}: {reasons}" if reasons else str(exc.detail))


def _reason(detail: object) -> str:
    if not isinstance(detail, dict):
        return str(detail)
    message = str(detail.get("message", detail))
    key = detail.get("key")
    return f"{key}: {message}" if key and key != "data" else message


def on_not_found(request: Request, _: NotFoundException) -> Response:
    return envelope(404, f"File Not Found: {request.method} {request.url.path}")


def on_too_large(request: Request, _: RequestEntityTooLarge) -> Response:
    limit = request.app.state.settings.server.max_body_bytes
    return envelope(413, f"the request body is larger than this server accepts ({limit} bytes, server.max_body_bytes)")


def on_http_error(_: Request, exc: HTTPException) -> Response:
    """Litestar's own errors (405 keeps its Allow header, malformed bodies, bad content-length)."""
    return envelope(exc.status_code, str(exc.detail), headers=exc.headers)


def on_unexpected(request: Request, exc: Exception) -> Response:
    error_id = new_error_id()
    events.unhandled_error(
        method=request.method, path=request.url.path, error_id=error_id, error_type=type(exc).__name__, exception=exc
    )
    return envelope(HTTP_500_INTERNAL_SERVER_ERROR, internal_error_message(error_id, exc))


HANDLERS = {
    ApiError: on_api_error,
    ValidationException: on_validation_error,
    NotFoundException: on_not_found,
    RequestEntityTooLarge: on_too_large,
    HTTPException: on_http_error,
    Exception: on_unexpected,
}
