"""The router's events (logger `mlxcel.router`): its models loading and unloading, each by the name
its `[router]` table gives it (never a client's string)."""

from __future__ import annotations

import structlog

_log = structlog.get_logger("mlxcel.router")


def router_model_loading(*, model: str, profile: str, weights_mb: float, budget_mb: int) -> None:
    _log.info(
        "router_model_loading", model=model, profile=profile, weights_mb=round(weights_mb, 1), budget_mb=budget_mb
    )


def router_model_loaded(*, model: str, profile: str, seconds: float) -> None:
    _log.info("router_model_loaded", model=model, profile=profile, seconds=round(seconds, 3))


def router_model_load_failed(*, model: str, profile: str, reason: str) -> None:
    _log.error("router_model_load_failed", model=model, profile=profile, reason=reason)


def router_model_unloaded(*, model: str, reason: str, seconds: float) -> None:
    """Its engine finished the rows it held and stopped (`seconds`: from the decision to the stop)."""
    _log.info("router_model_unloaded", model=model, reason=reason, seconds=round(seconds, 3))
