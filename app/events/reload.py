"""Hot profile reload's events (logger `mlxcel.reload`)."""

from __future__ import annotations

import structlog

_log = structlog.get_logger("mlxcel.reload")


def reload_requested(*, trigger: str) -> None:
    _log.info("reload_requested", trigger=trigger)


def reload_changed_access(*, trigger: str, keys: list[str], profile_file: str) -> None:
    """The reload changes who may call or what they see (`keys`: names only, never values)."""
    _log.warning("reload_changed_access", trigger=trigger, keys=keys, profile_file=profile_file)


def reload_succeeded(*, trigger: str, profile: str, profile_file: str, drafter_kind: str, seconds: float) -> None:
    _log.info(
        "reload_succeeded",
        trigger=trigger,
        profile=profile,
        profile_file=profile_file,
        drafter_kind=drafter_kind,
        seconds=round(seconds, 3),
    )


def reload_refused(*, trigger: str, reason: str) -> None:
    _log.warning("reload_refused", trigger=trigger, reason=reason)


def engine_released(*, profile: str) -> None:
    """The engine a reload replaced finished its last request and stopped."""
    _log.info("engine_released", profile=profile)
