"""`mlxcel serve`'s process events (logger `mlxcel.serve`): listening, ready, draining, exiting."""

from __future__ import annotations

from typing import Unpack

import structlog

from app.events.speculation import Startup

_log = structlog.get_logger("mlxcel.serve")


def listening(*, url: str, host: str, port: int) -> None:
    _log.info("listening", url=url, host=host, port=port)


def server_ready(**fields: Unpack[Startup]) -> None:
    """Startup finished: the keys of `acceptance_rule_active`."""
    _log.info("server_ready", **fields)


def connection_cap_lowered(*, wanted: int, max_connections: int, reason: str) -> None:
    _log.warning("connection_cap_lowered", wanted=wanted, max_connections=max_connections, reason=reason)


def draining(*, signal: str, timeout_s: float) -> None:
    _log.info("draining", signal=signal, timeout_s=timeout_s)


def drain_timed_out(*, rows: int) -> None:
    _log.warning("drain_timed_out", rows=rows)


def stopped_before_serving(*, signal: str) -> None:
    """SIGTERM or SIGINT before the server was built (while MLX and the app were imported): exit 0 at once."""
    _log.info("stopped_before_serving", signal=signal)


def forced_exit(*, signal: str) -> None:
    _log.warning("forced_exit", signal=signal)


def signal_repeated(*, signal: str) -> None:
    """The drain's own signal again within moments (a parent forwarding it): ignored."""
    _log.info("signal_repeated", signal=signal)
