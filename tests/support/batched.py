"""Driving several generations the way the engine's tick does: prefill chunks one row at a time,
then one decode step for every prefilled row with their forwards batched (`run_together`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.decoding.batch import run_together
from app.decoding.generation import Generation


@dataclass
class Arrival:
    generation: Generation
    joins: int = 0  # the tick it joins the batch at
    leaves: int | None = None  # the tick it is dropped at, finished or not (a cancelled request)


def run_batched(arrivals: Sequence[Arrival]) -> int:
    """Run every arrival until it finishes or leaves; the most rows that decoded in one tick."""
    waiting, live, widest, tick = list(arrivals), [], 0, 0
    while waiting or live:
        live += [a for a in waiting if a.joins <= tick]
        waiting = [a for a in waiting if a.joins > tick]
        live = [a for a in live if not a.generation.finished and (a.leaves is None or tick < a.leaves)]
        decoding = [a.generation for a in live if a.generation.prefilled]
        for arrival in live:
            if not arrival.generation.prefilled:
                next(arrival.generation)
        for outcome in run_together([generation.steps() for generation in decoding]):
            if isinstance(outcome, Exception):
                raise outcome
        widest = max(widest, len(decoding))
        tick += 1
    return widest
