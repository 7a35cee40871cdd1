"""The grammar compile worker (logger `mlxcel.grammar`)."""

from __future__ import annotations

import structlog

_log = structlog.get_logger("mlxcel.grammar")


def grammar_worker_started(*, pid: int) -> None:
    _log.info("grammar_worker_started", pid=pid)


def grammar_worker_lost(*, kind: str, reason: str, bytes: int) -> None:
    """A compile crashed or outran its time; `bytes`: the text's size, never the text."""
    _log.warning("grammar_worker_lost", kind=kind, reason=reason, bytes=bytes)


def grammar_compiled(*, kind: str, ms: float) -> None:
    """The worker compiled a grammar: a cached verdict logs nothing (which tells the operator, and the
    tests, hits from compiles)."""
    _log.info("grammar_compiled", kind=kind, ms=round(ms, 1))
