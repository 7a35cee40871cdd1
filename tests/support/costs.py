"""Measured costs made up for the width policy's tests: a forward's line, and costs that swing."""

from __future__ import annotations

from collections.abc import Callable

from app.decoding.goodput import Goodput
from app.execution.cost import ForwardCost


def measured(fixed: float, per_position: float) -> ForwardCost:
    """A record of two buckets on the line fixed + per_position * positions."""
    cost = ForwardCost()
    for positions in (8, 64):
        cost.observe(positions, fixed + per_position * positions)
    return cost


def swinging_costs(goodput: Goodput, every: int = 6) -> Callable[[], ForwardCost]:
    """Target costs that swing every `every` ticks of `goodput` between positions that cost
    nothing (every row drafts its own width) and positions that cost everything (rows decode
    plainly)."""
    free, dear = measured(0.05, 0.0), measured(0.0001, 0.01)
    return lambda: free if (goodput.ticks // every) % 2 else dear
