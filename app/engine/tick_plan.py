"""One tick as a value: what the scheduler decided before anything runs (`TickPlan`)."""

from __future__ import annotations

from dataclasses import dataclass

from app.decoding.row_events import Delta
from app.decoding.width import WidthOffer
from app.engine.row import Row
from app.execution.steps import Steps


@dataclass(frozen=True)
class TickPlan:
    """One tick, decided by the scheduler before it runs: the rows chosen (last tick's leftovers
    first) within the tick's `budget` of target positions (`server.max_batch_tokens`), each
    row's width offer (app/decoding/goodput.py: `OWN_WIDTH` for a row the choice made none for),
    whether the tick is the costly rows' own while cheap ones wait (`heavy`), and whether every
    row decodes (`priced`: the choice priced the whole tick, so its measured time calibrates
    the choice). `run_together(plan.steps())` runs it (app/execution/steps.py: a `TickResult`)."""

    rows: tuple[Row, ...]
    offers: tuple[WidthOffer, ...]
    budget: int
    heavy: bool = False
    priced: bool = False

    def steps(self) -> list[Steps[Delta]]:
        """Each row's step of this tick, within its offer, in the rows' order."""
        return [row.steps(offer) for row, offer in zip(self.rows, self.offers, strict=True)]
