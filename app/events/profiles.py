"""Settling a profile's drafter (logger `mlxcel.profiles`)."""

from __future__ import annotations

import structlog

_log = structlog.get_logger("mlxcel.profiles")


def drafter_kind_resolved(*, kind: str, explicit: bool, model: str) -> None:
    """A drafter model given with more authority than the kind got the kind its config.json describes."""
    _log.info("drafter_kind_resolved", kind=kind, explicit=explicit, model=model)


def drafter_model_ignored(*, kind: str, model: str) -> None:
    """The drafter kind drafts without a model, so the model given with it is unused."""
    _log.warning("drafter_model_ignored", kind=kind, model=model)
