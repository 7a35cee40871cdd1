"""The HTTP layer's events (logger `mlxcel.http`; `unhandled_error` through `mlxcel.server`)."""

from __future__ import annotations

import structlog

_log = structlog.get_logger("mlxcel.http")
_server = structlog.get_logger("mlxcel.server")


def http_request(
    *,
    request_id: str | None,
    method: str,
    path: str,
    route: str | None,
    status: int,
    duration_ms: float,
    prompt_n: int,
    predicted_n: int,
    profile: str,
    tenant: str | None,
    model: str | None,
) -> None:
    """Every HTTP request answered, any route and status (`model`: the router's name for the
    model it reached; None without a router)."""
    _log.info(
        "http_request",
        request_id=request_id,
        method=method,
        path=path,
        route=route,
        status=status,
        duration_ms=round(duration_ms, 3),
        prompt_n=prompt_n,
        predicted_n=predicted_n,
        profile=profile,
        tenant=tenant,
        model=model,
    )


def http_protocol_warning(*, message: str, client: str | None) -> None:
    """uvicorn could not parse a request, or refused a connection."""
    _log.warning("http_protocol_warning", message=message, client=client)


def http_limit(
    *,
    kind: str,
    count: int,
    client: str | None = None,
    action: str | None = None,
    limit: int | None = None,
    seconds: float | None = None,
    reason: str | None = None,
) -> None:
    """The listener refused something, `count` times since the last line of this `kind`, with the
    keys its kind gives: `connections_full` `action` and `limit`, the timeouts `client` and
    `seconds`, `head_too_large` `client` and `reason`."""
    given = {"client": client, "action": action, "limit": limit, "seconds": seconds, "reason": reason}
    _log.warning(
        "http_limit", kind=kind, count=count, **{key: value for key, value in given.items() if value is not None}
    )


def unhandled_error(*, method: str, path: str, error_id: str, error_type: str, exception: BaseException) -> None:
    """An HTTP handler raised (answered 500 naming `error_id`)."""
    _server.error(
        "unhandled_error", method=method, path=path, error_id=error_id, error_type=error_type, exc_info=exception
    )
