"""What a model's forward costs, measured: seconds against the positions it computed.

The tick's width choice (app/decoding/goodput.py) asks what a tick would cost at other widths, so
every measured pass is kept per model, by position count, as a running estimate in buckets of powers of
two (a running mean that rises more slowly than it falls: timing noise only adds, `_moved`); the
estimate is the least-squares line through the buckets (a forward costs a fixed part, dispatch and
weight reads, plus a part that grows with the positions). Until two buckets hold measurements
there is no line: the policy then prices from one bucket, or leaves the widths as they are.

The records a tick's cost is made of, each kept on the model it belongs to:

- `FORWARD` (`cost_of`), the target's batched forward (app/execution/forward.py
  `measured_forward`): seconds against the tick's positions; and `TARGET_ROWS` (`plane_of`), the
  same forwards against their rows and their positions (a row more costs its own attention and
  cache updates, a wider row only its positions: one line through both would price a wider row
  like more rows);
- `DRAFTING` (`plane_of`, on the drafter), a drafter's passes (a draft model's chain step j of
  every row, an MTP head's step, a DFlash-family block forward, each with the context rows it
  owes): a tick's drafting phase is timed as a whole and recorded as its mean pass, against the
  rows' positions of one pass and those of them drawn through a sampler. Prompt lookup forwards
  nothing and has no record: its drafting costs nothing;
- `HOST` (`plane_of`, on the target), the rest of a tick: what the rows do between the forwards
  (judging, sampling, rewinding, settling their drafters), against the tick's rows, verifying
  rows, positions and sampled positions (a sampled position's k + 1 rows through the sampler
  pipeline cost far more than an argmax).

`TickClock` times one batched tick's parts (app/execution/steps.py `run_together`) and records all but `FORWARD`.
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

import mlx.core as mx
import mlx.nn as nn

EMA = 0.2  # weight of the newest measurement in its bucket (costs drift as caches grow)
OUTLIER = 3.0  # a measurement counts as at most this many times its bucket's mean (once it has a few)
SETTLED = 3  # measurements a bucket holds before `OUTLIER` and `RISE` apply
RISE = 0.1  # the weight of a settled bucket's measurement above its estimate (below it: EMA)
FORWARD = "forward"  # `cost_of`'s record (module docstring)
TARGET_ROWS, HOST, DRAFTING = "target_rows", "host", "drafting"  # `plane_of`'s
INDEPENDENT = 0.05  # the share of a count's spread that must vary apart from the other counts'


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
        bucket.seconds = _moved(bucket.seconds, seconds, bucket.count, weight)
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


@dataclass
class PlaneBucket:
    counts: list[float]
    seconds: float
    n: int = 1


@dataclass
class PlaneCost:
    """Seconds of something against several counts of it (a forward's rows and positions; a
    tick's rows, verifying rows and positions): running means in buckets keyed by the counts (in
    powers of two), and the least-squares plane seconds = fixed + sum of per-count parts through
    the buckets' means. `keep` orders the counts, most wanted first: a count the buckets do not
    vary apart from those before it (every forward at one width keeps positions proportional to
    rows) is left out of the fit, as is the last one whose part comes out negative."""

    keep: tuple[int, ...]  # count indices, the one to keep in the fit first
    buckets: dict[tuple[int, ...], PlaneBucket] = field(default_factory=dict)

    def observe(self, counts: Sequence[int], seconds: float) -> None:
        key = tuple(int(c).bit_length() for c in counts)
        bucket = self.buckets.get(key)
        if bucket is None:
            self.buckets[key] = PlaneBucket([float(c) for c in counts], seconds)
            return
        weight = max(EMA, 1.0 / (bucket.n + 1))
        bucket.counts = [m + weight * (c - m) for m, c in zip(bucket.counts, counts, strict=True)]
        bucket.seconds = _moved(bucket.seconds, seconds, bucket.n, weight)
        bucket.n += 1

    def plane(self, near: int | None = None) -> tuple[float, list[float]] | None:
        """(fixed seconds, seconds per unit of each count), no part negative; None before any
        bucket. `near`: fit the buckets whose first count is within a factor of about two of it
        (where there are enough of them), a plane of the neighbourhood the choice is made in: costs
        grow more slowly than linearly across many sizes (dispatch and weight reads are shared)."""
        if not self.buckets:
            return None
        points = list(self.buckets.values())
        size = len(points[0].counts)
        if near is not None:
            close = [p for p in points if abs(int(p.counts[0]).bit_length() - near.bit_length()) <= 1]
            points = close if len(close) > size + 1 else points
        active = [j for j in self.keep if j < size]
        while True:
            fixed, parts, undetermined = _least_squares(points, active)
            if undetermined is not None:
                active.remove(undetermined)
                continue
            negative = [j for j in active if parts[j] < 0]
            if negative:
                active.remove(negative[-1])
                continue
            return fixed, [parts.get(j, 0.0) for j in range(size)]


def _least_squares(points: Sequence[PlaneBucket], active: list[int]) -> tuple[float, dict[int, float], int | None]:
    """seconds = fixed + sum over the `active` counts of part * count through the points' means,
    on standardised counts; the first active count (in order) the fit cannot determine (it varies
    apart from those before it by less than `INDEPENDENT` of its spread, or too few points), if any."""
    n = len(points)
    mean_y = sum(p.seconds for p in points) / n
    if not active:
        return mean_y, {}, None
    columns = [[p.counts[j] for p in points] for j in active]
    means = [sum(column) / n for column in columns]
    centred = [[v - m for v in column] for column, m in zip(columns, means, strict=True)]
    scales = [math.sqrt(sum(v * v for v in column) / n) for column in centred]
    for i, scale in enumerate(scales):
        if scale <= 0 or i + 1 >= n:  # a count that never moved, or as many parts as points
            return mean_y, {}, active[i]
    z = [[v / s for v in column] for column, s in zip(centred, scales, strict=True)]
    ys = [p.seconds - mean_y for p in points]
    k = len(active)
    matrix = [[sum(a * b for a, b in zip(z[i], z[j], strict=True)) / n for j in range(k)] for i in range(k)]
    vector = [sum(a * y for a, y in zip(z[i], ys, strict=True)) / n for i in range(k)]
    solution, undetermined = _solve_correlations(matrix, vector)
    if solution is None:
        return mean_y, {}, active[undetermined]
    parts = {j: solution[i] / scales[i] for i, j in enumerate(active)}
    return mean_y - sum(parts[j] * m for j, m in zip(active, means, strict=True)), parts, None


def _solve_correlations(matrix: list[list[float]], vector: list[float]) -> tuple[list[float] | None, int]:
    """Gaussian elimination of a correlation matrix (symmetric, unit diagonal), in order: each
    pivot is the share of its count's spread the counts before it do not explain; (None, that
    count's place) at the first below `INDEPENDENT`."""
    n = len(vector)
    rows = [[*matrix[i], vector[i]] for i in range(n)]
    for col in range(n):
        if rows[col][col] < INDEPENDENT:
            return None, col
        for r in range(col + 1, n):
            factor = rows[r][col] / rows[col][col]
            rows[r] = [a - factor * b for a, b in zip(rows[r], rows[col], strict=True)]
    solution = [0.0] * n
    for i in reversed(range(n)):
        solution[i] = (rows[i][n] - sum(rows[i][j] * solution[j] for j in range(i + 1, n))) / rows[i][i]
    return solution, -1


# the counts each plane keeps first: positions before rows; a verify round's own work, positions,
# sampled positions, rows; a pass's positions, then its sampled ones
KEEP = {TARGET_ROWS: (1, 0), HOST: (1, 2, 3, 0), DRAFTING: (0, 1)}


def plane_of(model: nn.Module, record: str) -> PlaneCost:
    """The model's measured costs against several counts (`TARGET_ROWS`: rows, positions; `HOST`:
    rows, verifying rows, positions, sampled positions; `DRAFTING`: a pass's positions and its
    sampled ones; `TickClock` records them)."""
    records = _records(model)
    key = f"plane_{record}"
    if key not in records:
        records[key] = PlaneCost(KEEP[record])
    return records[key]  # type: ignore[return-value]


def forget(model: nn.Module) -> None:
    """Drop every record of `model` (a warm-up's forwards time kernels being compiled)."""
    _records(model).clear()


def _moved(estimate: float, seconds: float, count: int, weight: float) -> float:
    """A bucket's estimate after one more measurement. Timing noise only ever adds (another
    process took the cores, a kernel compiled), so once a bucket has settled a measurement above
    its estimate moves it less (`RISE`) than one below, and one far above counts as `OUTLIER`
    times the estimate: the estimate follows what a tick costs when nothing else intervenes, and
    a real rise (caches grown longer) still shows within a few ticks."""
    if count < SETTLED:
        return estimate + weight * (seconds - estimate)
    if seconds <= estimate:
        return estimate + EMA * (seconds - estimate)
    return estimate + RISE * (min(seconds, OUTLIER * estimate) - estimate)


def cost_of(model: nn.Module, record: str = FORWARD) -> ForwardCost:
    """The model's measured costs of one kind against positions (`FORWARD`): one record per loaded
    model and kind, whoever runs it."""
    records = _records(model)
    if record not in records:
        records[record] = ForwardCost()
    return records[record]  # type: ignore[return-value]


_RECORDS: dict[int, dict[str, ForwardCost | PlaneCost]] = {}  # id(model): its records (gone with it)


def _records(model: nn.Module) -> dict[str, ForwardCost | PlaneCost]:
    """The model's measurements, kept beside the model, not on it."""
    if id(model) not in _RECORDS:
        _RECORDS[id(model)] = {}
        weakref.finalize(model, _RECORDS.pop, id(model), None)
    return _RECORDS[id(model)]


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
    pass_sampled: int = 0
    drafter: nn.Module | None = None  # the drafter whose passes ran (None: none, or several)
    several_drafters: bool = False
    forward_s: float = 0.0
    rows: int = 0
    verifying: int = 0  # rows whose forward verified drafts (more than their pending token)
    positions: int = 0
    sampled: int = 0  # positions of rows whose sampler draws
    target: nn.Module | None = None
    several_targets: bool = False
    rest_s: float = 0.0  # the rest of the tick, once closed

    def drafted(self, model: nn.Module, positions: int, sampled: int) -> None:
        """A drafter pass over `positions` (its rows' tokens; `sampled` of them drawn through a
        sampler) was queued."""
        if self.drafting_from is None:
            self.drafting_from = time.perf_counter()
        self.several_drafters |= self.drafter is not None and self.drafter is not model
        self.drafter = model
        self.passes += 1
        self.pass_positions += positions
        self.pass_sampled += sampled

    def drafts_read(self, inputs: Sequence[mx.array]) -> None:
        """The target forward is next: evaluate what it reads of the drafts (`inputs`), so the
        drafting phase ends here and the forward's measurement holds the target's work alone."""
        if self.drafting_from is None:
            return
        mx.eval(*inputs)
        self.drafting_s += time.perf_counter() - self.drafting_from
        self.drafting_from = None

    def forwarded(self, model: nn.Module, positions: Sequence[int], sampled: Sequence[bool], seconds: float) -> None:
        """The target's forward of rows of these `positions` (their samplers drawing where
        `sampled`) took `seconds`."""
        self.several_targets |= self.target is not None and self.target is not model
        self.target = model
        self.rows += len(positions)
        self.verifying += sum(p > 1 for p in positions)
        self.positions += sum(positions)
        self.sampled += sum(p for p, draws in zip(positions, sampled, strict=True) if draws)
        self.forward_s += seconds

    def close(self) -> None:
        if self.drafting_from is not None:  # passes whose rows then asked for no target forward
            self.drafting_s += time.perf_counter() - self.drafting_from
        if self.drafter is not None and not self.several_drafters and self.passes:
            mean = (round(self.pass_positions / self.passes), round(self.pass_sampled / self.passes))
            plane_of(self.drafter, DRAFTING).observe(mean, self.drafting_s / self.passes)  # the mean pass
        self.rest_s = max(0.0, time.perf_counter() - self.started - self.drafting_s - self.forward_s)
        if self.target is not None and not self.several_targets:
            counts = (self.rows, self.verifying, self.positions, self.sampled)
            plane_of(self.target, HOST).observe(counts, self.rest_s)
            plane_of(self.target, TARGET_ROWS).observe((self.rows, self.positions), self.forward_s)
