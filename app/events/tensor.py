"""A tensor-parallel target's ranks (logger `mlxcel.tensor`)."""

from __future__ import annotations

import structlog

_log = structlog.get_logger("mlxcel.tensor")


def ranks_launching(*, world_size: int, command: list[str]) -> None:
    """The supervisor starts the ranks under mlx.launch."""
    _log.info("ranks_launching", world_size=world_size, command=command)


def supervisor_gone(*, supervisor_pid: int) -> None:
    """A rank's supervisor died (the rank exits)."""
    _log.warning("supervisor_gone", supervisor_pid=supervisor_pid)


def rank_ready(*, rank: int, world_size: int) -> None:
    """A follower rank holds its shard and waits for rank 0's orders."""
    _log.info("rank_ready", rank=rank, world_size=world_size)


def rank_stopped(*, rank: int) -> None:
    _log.info("rank_stopped", rank=rank)


def rank_waiting_for_rank_0(*, signal: str, timeout_s: float) -> None:
    """A follower got a stop signal: it stops when rank 0 says so, or exits after `timeout_s`."""
    _log.info("rank_waiting_for_rank_0", signal=signal, timeout_s=timeout_s)
