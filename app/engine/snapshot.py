"""What HTTP handlers read of the engine: a frozen copy, made without waiting on the engine thread."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from app.decoding.builder import RowRequest
from app.decoding.plan import LoopPlan
from app.engine.host import ModelInfo
from app.engine.metrics import Metrics
from app.engine.row import Row
from app.engine.scheduler import EngineState
from app.profiles.schema import Settings


@dataclass(frozen=True)
class DraftCounts:
    proposed: int
    accepted: int
    rounds: int


@dataclass(frozen=True)
class RowView:
    """One busy slot: its request and how far it has come."""

    slot: int
    request_id: str
    request: RowRequest
    decided: int
    finished: bool
    draft: DraftCounts | None  # None for loops that verify nothing


@dataclass(frozen=True)
class EngineSnapshot:
    state: EngineState
    settings: Settings
    plan: LoopPlan
    model: ModelInfo | None  # None until the models are loaded
    metrics: Metrics  # a copy
    rows: tuple[RowView, ...]  # busy slots, by slot


def row_view(row: Row) -> RowView:
    speculation = row.generation.loop.speculation
    stats = speculation.stats
    return RowView(
        slot=row.slot,
        request_id=row.job.request_id,
        request=row.job.request,
        decided=len(row.generation.emitted),
        finished=row.generation.finished,
        draft=DraftCounts(stats.proposed, stats.accepted, stats.rounds) if speculation.drafting else None,
    )


def copy_metrics(metrics: Metrics) -> Metrics:
    return dataclasses.replace(metrics, spec_accepted_per_position=list(metrics.spec_accepted_per_position))
