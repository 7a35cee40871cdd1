"""What a model's forward costs, measured: seconds against the positions it computed.

The width policy (app/decoding/width.py) asks what a tick would cost at other widths, so every
measured pass is kept per model, by position count, as a running mean in buckets of powers of
two; the estimate is the least-squares line through the buckets' means (a forward costs a fixed
part, dispatch and weight reads, plus a part that grows with the positions). Until two buckets
hold measurements there is no line: the policy then leaves the widths as they are.

Three records a tick's cost is made of, each kept on the model it belongs to (`cost_of`):

- `FORWARD`, the target's batched forward (app/execution/forward.py `measured_forward`): seconds
  against the tick's positions;
- `DRAFTING`, a drafter's passes (a draft model's chain step j of every row, an MTP head's step,
  a DFlash-family block forward, each with the context rows it owes): a tick's drafting phase is
  timed as a whole and recorded as its mean pass, seconds against the rows' positions of one pass
  (`observe_mean`). Prompt lookup forwards nothing and has no record: its drafting costs nothing;
- `HOST`, the rest of a tick, kept on the target: what the rows do between the forwards (judging,
  sampling, rewinding, settling their drafters), recorded per row against the positions per row,
  so a wider round's host work (its k + 1 rows sampled at T > 0) is priced with it.

`TickClock` times one batched tick's parts (app/decoding/batch.py) and records the last two.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import mlx.core as mx
import mlx.nn as nn

EMA = 0.2  # weight of the newest measurement in its bucket (costs drift as caches grow)
COST = "_mlxcel_forward_cost"  # where `cost_of` keeps a model's measurements
FORWARD, DRAFTING, HOST = "forward", "drafting", "host"  # the records (module docstring)


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

    def observe_mean(self, parts: int, positions: int, seconds: float) -> None:
        """`parts` equal parts (passes, rows) that took `seconds` over `positions` in all, as
        their mean part: the record's line is then per part (a pass, a row)."""
        if parts > 0 and positions > 0:
            self.observe(max(1, round(positions / parts)), seconds / parts)

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


def cost_of(model: nn.Module, record: str = FORWARD) -> ForwardCost:
    """The model's measured costs of one kind (`FORWARD`, `DRAFTING`, `HOST`): one record per
    loaded model and kind, whoever runs it."""
    known = vars(model)  # the object's own attributes, not the module tree (a Module is a dict)
    key = COST if record == FORWARD else f"{COST}_{record}"
    if key not in known:
        known[key] = ForwardCost()
    return known[key]


@dataclass
class TickClock:
    """One batched tick's wall time in its parts: the drafting phase (every drafter pass, from the
    first until the drafts the target forward reads are evaluated), the target forward, and the
    rest. `close` records the drafting phase on its drafter (`DRAFTING`) and the rest on the
    target (`HOST`); the target forward records itself (`measured_forward`)."""

    started: float = field(default_factory=time.perf_counter)
    drafting_from: float | None = None
    drafting_s: float = 0.0
    passes: int = 0
    pass_positions: int = 0
    drafter: nn.Module | None = None  # the drafter whose passes ran (None: none, or several)
    several_drafters: bool = False
    forward_s: float = 0.0
    rows: int = 0
    positions: int = 0
    target: nn.Module | None = None

    def drafted(self, model: nn.Module, positions: int) -> None:
        """A drafter pass over `positions` (its rows' tokens) was queued."""
        if self.drafting_from is None:
            self.drafting_from = time.perf_counter()
        self.several_drafters |= self.drafter is not None and self.drafter is not model
        self.drafter = model
        self.passes += 1
        self.pass_positions += positions

    def drafts_read(self, inputs: Sequence[mx.array]) -> None:
        """The target forward is next: evaluate what it reads of the drafts (`inputs`), so the
        drafting phase ends here and the forward's measurement holds the target's work alone."""
        if self.drafting_from is None:
            return
        mx.eval(*inputs)
        self.drafting_s += time.perf_counter() - self.drafting_from
        self.drafting_from = None

    def forwarded(self, model: nn.Module, rows: int, positions: int, seconds: float) -> None:
        self.target = model
        self.rows += rows
        self.positions += positions
        self.forward_s += seconds

    def close(self) -> None:
        if self.drafting_from is not None:  # passes whose rows then asked for no target forward
            self.drafting_s += time.perf_counter() - self.drafting_from
        if self.drafter is not None and not self.several_drafters:
            cost_of(self.drafter, DRAFTING).observe_mean(self.passes, self.pass_positions, self.drafting_s)
        if self.target is not None:
            rest = time.perf_counter() - self.started - self.drafting_s - self.forward_s
            cost_of(self.target, HOST).observe_mean(self.rows, self.positions, max(0.0, rest))
