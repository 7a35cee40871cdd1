"""Acceptance events: structlog lines whose names and keys are a contract for log pipelines.

Every event and key is documented in docs/log-events.md; add keys, never rename them.
"""

from __future__ import annotations

from typing import Any

import structlog

from app.acceptance import AcceptanceStats

LOGGER = "mlxcel.events"


def acceptance_rule_active(**fields: Any) -> None:
    """Once at startup: the loop this server built and the rule it runs."""
    structlog.get_logger(LOGGER).info("acceptance_rule_active", **fields)


def speculative_request(
    *,
    request_id: str,
    route: str,
    rule: str,
    draft_kind: str,
    stats: AcceptanceStats,
    predicted_n: int,
    biased: bool,
    coupled: bool,
    n_max: int,
    widths: dict[int, int],
    plain_steps: int = 0,
    governor_pauses: int = 0,
    governor_resumes: int = 0,
    profile: str,
) -> None:
    """Once per finished request that ran at least one verify round."""
    structlog.get_logger(LOGGER).info(
        "speculative_request",
        request_id=request_id,
        route=route,
        profile=profile,
        rule=rule,
        draft_kind=draft_kind,
        biased=biased,
        coupled=coupled,
        rounds=stats.rounds,
        proposed=stats.proposed,
        positions_tested=stats.positions_tested,
        accepted=stats.accepted,
        per_position_acceptance=round(stats.per_position_acceptance, 4),
        mean_accepted_len=round(stats.mean_accepted_len, 4),
        predicted_n=predicted_n,
        n_max=n_max,
        widths={str(width): rounds for width, rounds in sorted(widths.items())},
        plain_steps=plain_steps,
        governor_pauses=governor_pauses,
        governor_resumes=governor_resumes,
    )


def governor_changed(event: str, *, request_id: str, decided: int, ema: float, floor: float | None) -> None:
    """`governor_paused` or `governor_resumed` for one row."""
    structlog.get_logger(LOGGER).info(event, request_id=request_id, decided=decided, ema=round(ema, 4), floor=floor)


def speculation_width_changed(
    *,
    request_id: str,
    batch: int,
    cap: int | None,
    previous: int | None,
    expected_gain: float,
    prices: dict[str, list[float]],
) -> None:
    """The engine's per-tick choice now holds row `request_id` at width `cap` (None: the row's own
    width) among `batch` decoding rows, expecting `expected_gain` times the tick's tokens per
    second at every row's own width, at the tick's measured `prices` (milliseconds)."""
    structlog.get_logger(LOGGER).info(
        "speculation_width_changed",
        request_id=request_id,
        batch=batch,
        cap=cap,
        previous=previous,
        expected_gain=expected_gain,
        prices=prices,
    )


def loop_note(event: str, *, request_id: str | None, warning: bool, **fields: object) -> None:
    """How a block-loop request was served: `drafter_loaded`, `exactness_probe`,
    `exactness_probe_overridden` or `block_loop_declined`; `warning`: the one warning of the
    outcome (a decline or override; a failed probe only when nothing else reports it)."""
    log = structlog.get_logger(LOGGER)
    (log.warning if warning else log.info)(event, request_id=request_id, **fields)
