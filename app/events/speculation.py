"""The speculation events (logger `mlxcel.events`): the loop a server or `mlxcel generate` built, each
row's verify rounds, its width changes and governor, and how a block loop served it."""

from __future__ import annotations

from typing import TypedDict, Unpack

import structlog

from app.events import Level

_log = structlog.get_logger("mlxcel.events")


class Startup(TypedDict):
    """The round loop built, and where it listens: `acceptance_rule_active` and `server_ready`."""

    profile: str
    profile_file: str
    target: str
    drafter_kind: str
    drafter_model: str | None
    rule: str | None
    rule_at_temperature_0: str | None
    coupled: bool
    width: int | None
    adaptive_max_width: int | None
    governor_floor: float | None
    governor_policy: str | None
    env_overrides: dict[str, str]
    batching: str | None
    template_renders_tools: bool | None
    model_calls_tools: bool | None  # the load-time tool probe's finding (app/engine/tool_probe.py)
    exact: bool
    host: str | None  # None: `mlxcel generate`, which listens nowhere
    port: int | None


class Speculated(TypedDict):
    """What one row's verify rounds did: `speculative_request` (a server's row) and
    `speculative_decode_finished` (`mlxcel generate`'s), from `Generation.speculated`."""

    rule: str
    draft_kind: str
    biased: bool
    coupled: bool
    rounds: int
    proposed: int
    positions_tested: int
    accepted: int
    per_position_acceptance: float
    mean_accepted_len: float
    predicted_n: int
    n_max: int
    widths: dict[str, int]  # verify rounds by width, the widths as strings
    plain_steps: int
    governor_pauses: int
    governor_resumes: int


def acceptance_rule_active(**fields: Unpack[Startup]) -> None:
    """Once the loop is built (at startup, after each reload, and in `mlxcel generate`)."""
    _log.info("acceptance_rule_active", **fields)


def speculative_request(*, request_id: str, route: str, profile: str, **fields: Unpack[Speculated]) -> None:
    """Once per finished request that ran at least one verify round."""
    _log.info("speculative_request", request_id=request_id, route=route, profile=profile, **fields)


def governor_paused(*, request_id: str, decided: int, ema: float, floor: float | None) -> None:
    """Prompt lookup's governor paused drafting for a row."""
    _log.info("governor_paused", request_id=request_id, decided=decided, ema=round(ema, 4), floor=floor)


def governor_resumed(*, request_id: str, decided: int, ema: float, floor: float | None) -> None:
    """Prompt lookup's governor resumed drafting for a row."""
    _log.info("governor_resumed", request_id=request_id, decided=decided, ema=round(ema, 4), floor=floor)


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
    _log.info(
        "speculation_width_changed",
        request_id=request_id,
        batch=batch,
        cap=cap,
        previous=previous,
        expected_gain=expected_gain,
        prices=prices,
    )


def tick_timed(
    *,
    rows: int,
    drafting_rows: int,
    widths: list[int],
    passes: int,
    drafting_ms: float,
    forward_ms: float,
    rest_ms: float,
    predicted_ms: float | None,
) -> None:
    """A tick of decoding rows, timed part by part (debug: one line per tick): its `rows`, the
    `drafting_rows` among them at their `widths` this tick, the drafter `passes` and their phase,
    the target's forward, the rest, and what the width choice predicted the tick would take."""
    _log.debug(
        "tick_timed",
        rows=rows,
        drafting_rows=drafting_rows,
        widths=widths,
        passes=passes,
        drafting_ms=round(drafting_ms, 3),
        forward_ms=round(forward_ms, 3),
        rest_ms=round(rest_ms, 3),
        predicted_ms=None if predicted_ms is None else round(predicted_ms, 3),
    )


# How a block-loop request was served. `request_id` is None for what a reload's engine did before
# serving; `level`: the one warning of the outcome (a decline or an override; a failed probe only
# when nothing else reports it).


def drafter_loaded(*, request_id: str | None, path: str, seconds: float, level: Level = "info") -> None:
    getattr(_log, level)("drafter_loaded", request_id=request_id, path=path, seconds=round(seconds, 3))


def exactness_probe(
    *, request_id: str | None, width: int, exact: bool, position: int | None, level: Level = "info"
) -> None:
    getattr(_log, level)("exactness_probe", request_id=request_id, width=width, exact=exact, position=position)


def exactness_probe_overridden(
    *, request_id: str | None, width: int, position: int | None, env: str, level: Level = "warning"
) -> None:
    getattr(_log, level)("exactness_probe_overridden", request_id=request_id, width=width, position=position, env=env)


def block_loop_declined(
    *,
    request_id: str | None,
    reason: str,
    width: int | None = None,
    position: int | None = None,
    level: Level = "warning",
) -> None:
    """`width` and `position` name a failed probe's (none for a greedy-only drafter asked to sample)."""
    probe = {"width": width, "position": position} if width is not None else {}
    getattr(_log, level)("block_loop_declined", request_id=request_id, reason=reason, **probe)
