"""What HTTP handlers read of the engine: a frozen copy, made without waiting on the engine thread."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from app.decoding.builder import RowRequest
from app.decoding.generation import Generation
from app.decoding.plan import LoopPlan
from app.engine.host import ModelInfo
from app.engine.metrics import Metrics
from app.engine.row import Row
from app.engine.scheduler import EngineState
from app.execution.prompt_cache import CacheCounters
from app.profiles.schema import Settings


@dataclass(frozen=True)
class DraftCounts:
    proposed: int
    accepted: int
    rounds: int
    width: int | None  # its latest step's width as its width policy decided it (0: plain; None: none yet)


@dataclass(frozen=True)
class RowView:
    """One busy slot: its request and how far it has come."""

    slot: int
    request_id: str
    request: RowRequest
    prompt_n: int
    cache_n: int  # of the prompt's tokens, those restored from the prompt cache
    decided: int
    finished: bool
    n_max: int  # the row's width cap (app/decoding/width.py row_n_max)
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
    generation = row.generation
    return RowView(
        slot=row.slot,
        request_id=row.job.request_id,
        request=row.job.request,
        prompt_n=row.generation.prompt_n,
        cache_n=row.generation.cache_n,
        decided=len(row.generation.emitted),
        finished=row.generation.finished,
        n_max=generation.n_max,
        draft=draft_counts(generation),
    )


def draft_counts(generation: Generation) -> DraftCounts | None:
    """A drafting row's counts so far and its current width (None: the row runs no drafter)."""
    if not generation.speculation.drafting or generation.widths is None:
        return None
    stats = generation.stats.acceptance
    return DraftCounts(stats.proposed, stats.accepted, stats.rounds, generation.widths.current)


def copy_metrics(metrics: Metrics, cache: CacheCounters | None) -> Metrics:
    """A copy for HTTP, with the prompt cache's counters as they are now (zeros: no cache runs)."""
    cache = cache or CacheCounters()
    return dataclasses.replace(
        metrics,
        spec_accepted_per_position=list(metrics.spec_accepted_per_position),
        spec_accepted_lengths=list(metrics.spec_accepted_lengths),
        spec_widths=list(metrics.spec_widths),
        prompt_cache_hits_total=cache.hits,
        prompt_cache_misses_total=cache.misses,
        prompt_cache_evictions_total=cache.evictions,
        prompt_cache_bytes=cache.bytes,
    )
