"""What a model's forward costs, measured: seconds against the positions it computed.

The width policy (app/decoding/width.py) asks what a tick's target forward would cost at other
widths, so every measured pass is kept per model, by position count, as a running mean in
buckets of powers of two; the estimate is the least-squares line through the buckets' means
(a forward costs a fixed part, dispatch and weight reads, plus a part that grows with the
positions). Until two buckets hold measurements there is no estimate: the policy then leaves
the widths as they are.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import mlx.nn as nn

EMA = 0.2  # weight of the newest measurement in its bucket (costs drift as caches grow)


@dataclass
class Bucket:
    positions: float
    seconds: float
    count: int = 1


@dataclass
class ForwardCost:
    buckets: dict[int, Bucket] = field(default_factory=dict)  # positions.bit_length() -> means

    def observe(self, positions: int, seconds: float) -> None:
        key = positions.bit_length()
        bucket = self.buckets.get(key)
        if bucket is None:
            self.buckets[key] = Bucket(float(positions), seconds)
            return
        weight = max(EMA, 1.0 / (bucket.count + 1))
        bucket.positions += weight * (positions - bucket.positions)
        bucket.seconds += weight * (seconds - bucket.seconds)
        bucket.count += 1

    def line(self) -> tuple[float, float] | None:
        """(fixed seconds, seconds per position) of the fitted line, so a forward of P positions
        is estimated at fixed + P * per position; None before two buckets."""
        if len(self.buckets) < 2:
            return None
        xs = [b.positions for b in self.buckets.values()]
        ys = [b.seconds for b in self.buckets.values()]
        mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
        spread = sum((x - mean_x) ** 2 for x in xs)
        slope = max(0.0, sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread)
        return max(0.0, mean_y - slope * mean_x), slope


_COSTS: dict[int, ForwardCost] = {}  # id(model): its measurements (an entry goes with its model)


def cost_of(model: nn.Module) -> ForwardCost:
    """The model's measured forward costs (one record per loaded model, whoever forwards it),
    kept beside the model, not on it."""
    if id(model) not in _COSTS:
        _COSTS[id(model)] = ForwardCost()
        weakref.finalize(model, _COSTS.pop, id(model), None)
    return _COSTS[id(model)]
