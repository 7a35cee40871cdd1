"""What a model's forward costs, measured: seconds against the positions it computed.

The width policy (app/decoding/width.py) asks what a tick would cost at other widths, so every
measured pass is kept per model, by position count, as a running mean in buckets of powers of
two; the estimate is the least-squares line through the buckets' means (a forward costs a fixed
part, dispatch and weight reads, plus a part that grows with the positions). Until two buckets
hold measurements there is no line: the policy then leaves the widths as they are.

Three records a tick's cost is made of, each kept on the model it belongs to (`cost_of`):

- `FORWARD`, the target's batched forward (app/execution/forward.py `measured_forward`): seconds
  against the tick's positions; and `rows_cost_of`, the same forwards against their rows and
  their positions (a row more costs its own attention and cache updates, a wider row only its
  positions: one line through both would price a wider row like more rows);
- `DRAFTING`, a drafter's passes (a draft model's chain step j of every row, an MTP head's step,
  a DFlash-family block forward, each with the context rows it owes): a tick's drafting phase is
  timed as a whole and recorded as its mean pass, seconds against the rows' positions of one pass
  (`observe_mean`). Prompt lookup forwards nothing and has no record: its drafting costs nothing;
- `HOST`, the rest of a tick, kept on the target: what the rows do between the forwards (judging,
  sampling, rewinding, settling their drafters), recorded per row against the positions per row,
  so a wider round's host work (its k + 1 rows sampled at T > 0) is priced with it.

`TickClock` times one batched tick's parts (app/decoding/batch.py) and records all but `FORWARD`.
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
ROWS_COST = "_mlxcel_rows_cost"
SINGULAR = 1e-9  # a fit whose normal equations are this close to singular (relative) has no answer
SPREAD = 1.25  # positions per row must spread by this factor over the buckets to tell rows from positions


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


@dataclass
class RowsBucket:
    rows: float
    positions: float
    seconds: float
    count: int = 1


@dataclass
class RowsCost:
    """A forward's seconds against its rows and its positions: running means in buckets keyed by
    (rows, positions.bit_length()), and the least-squares plane seconds = fixed + per row * rows +
    per position * positions through them. No plane while the buckets cannot tell rows from
    positions (every forward at one width, so positions stay proportional to rows)."""

    buckets: dict[tuple[int, int], RowsBucket] = field(default_factory=dict)

    def observe(self, rows: int, positions: int, seconds: float) -> None:
        key = (rows, positions.bit_length())
        bucket = self.buckets.get(key)
        if bucket is None:
            self.buckets[key] = RowsBucket(float(rows), float(positions), seconds)
            return
        weight = max(EMA, 1.0 / (bucket.count + 1))
        bucket.positions += weight * (positions - bucket.positions)
        bucket.seconds += weight * (seconds - bucket.seconds)
        bucket.count += 1

    def plane(self) -> tuple[float, float, float] | None:
        """(fixed, per row, per position) seconds, none negative; None where the buckets do not
        determine them (fewer than three, or positions per row spread by less than `SPREAD`)."""
        points = [(b.rows, b.positions, b.seconds) for b in self.buckets.values()]
        widths = [p / r for r, p, _ in points]
        if len(points) < 3 or max(widths) < SPREAD * min(widths):
            return None
        fit = _least_squares(points, rows=True, positions=True)
        if fit is not None and fit[1] < 0:  # a negative part fits nothing real: fit without it
            fit = _least_squares(points, rows=False, positions=True)
        elif fit is not None and fit[2] < 0:
            fit = _least_squares(points, rows=True, positions=False)
        if fit is None:
            return None
        fixed, per_row, per_position = fit
        return max(0.0, fixed), max(0.0, per_row), max(0.0, per_position)


def _least_squares(
    points: list[tuple[float, float, float]], rows: bool, positions: bool
) -> tuple[float, float, float] | None:
    """seconds = a + b * rows + c * positions through `points` (b or c held at 0 where not
    `rows`, `positions`); None where the normal equations are (near) singular."""
    design = [[1.0, *([r] if rows else []), *([p] if positions else [])] for r, p, _ in points]
    n = len(design[0])
    matrix = [[sum(x[i] * x[j] for x in design) for j in range(n)] for i in range(n)]
    vector = [sum(x[i] * point[2] for x, point in zip(design, points, strict=True)) for i in range(n)]
    solution = _solve(matrix, vector)
    if solution is None:
        return None
    parts = iter(solution[1:])
    return solution[0], next(parts) if rows else 0.0, next(parts) if positions else 0.0


def _solve(matrix: list[list[float]], vector: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None for a (near) singular system."""
    n = len(vector)
    rows = [[*matrix[i], vector[i]] for i in range(n)]
    scale = max(abs(v) for row in matrix for v in row) or 1.0
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(rows[r][col]))
        if abs(rows[pivot][col]) <= SINGULAR * scale:
            return None
        rows[col], rows[pivot] = rows[pivot], rows[col]
        for r in range(n):
            if r != col:
                factor = rows[r][col] / rows[col][col]
                rows[r] = [a - factor * b for a, b in zip(rows[r], rows[col], strict=True)]
    return [rows[i][n] / rows[i][i] for i in range(n)]


def rows_cost_of(model: nn.Module) -> RowsCost:
    """The model's forwards against rows and positions (`TickClock` records them)."""
    known = vars(model)
    if ROWS_COST not in known:
        known[ROWS_COST] = RowsCost()
    return known[ROWS_COST]


def forget(model: nn.Module) -> None:
    """Drop every record kept on `model` (a warm-up's forwards time kernels being compiled)."""
    known = vars(model)
    for key in [key for key in known if key.startswith(COST) or key == ROWS_COST]:
        del known[key]


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
    several_targets: bool = False

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
        self.several_targets |= self.target is not None and self.target is not model
        self.target = model
        self.rows += rows
        self.positions += positions
        self.forward_s += seconds

    def close(self) -> None:
        if self.drafting_from is not None:  # passes whose rows then asked for no target forward
            self.drafting_s += time.perf_counter() - self.drafting_from
        if self.drafter is not None and not self.several_drafters:
            cost_of(self.drafter, DRAFTING).observe_mean(self.passes, self.pass_positions, self.drafting_s)
        if self.target is not None and not self.several_targets:
            rest = time.perf_counter() - self.started - self.drafting_s - self.forward_s
            cost_of(self.target, HOST).observe_mean(self.rows, self.positions, max(0.0, rest))
            rows_cost_of(self.target).observe(self.rows, self.positions, self.forward_s)
