"""Every forward of the project: rows in (a runner and the tokens to append to it), logits out.

`forward(rows)` gives, bit for bit, what `[row.runner.forward(row.tokens) for row in rows]` gives
(a row's output never depends on its batch-mates), and leaves each runner's keys and `length` as
those calls would. A capture open on the model's taps (target_taps.py) gets each row's slices as
its own forward would give them, and a row with a block drafter's hook gets its own hidden
states, so block-drafter rows share the target's tick with every other row.

Rows of a model whose rows share the KV pool (app/execution/prepare.py) go through one tick
(app/execution/tick.py): every row's tokens in one call of mlx-lm's own model module, one
scatter and one attention call per layer. That is exact because every kernel in it computes a
token from its own row's inputs only, the same way whatever the tick holds: on the CPU the BLAS
shim's row-stable product (app/runtime/sgemm_rows.c) and an attention whose reductions cannot
see past a query's keys (app/execution/attention.py), on CUDA the row-invariant kernels
(app/execution/row_invariant.py). A tick carries at most `row_stable_rows()` tokens (1024: the
default `server.max_batch_tokens`); rows are packed into ticks of at most that many, in order.
Rows of any other model run one forward each (`batching()` says why, once, in the startup event).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import mlx.core as mx
import mlx.nn as nn

from app.execution.cost import cost_of
from app.execution.device import backend
from app.execution.prepare import prepared
from app.execution.runner import ModelRunner, Tokens
from app.execution.target_taps import FeatureHook
from app.execution.tick import forward_rows


@dataclass(frozen=True)
class RowForward:
    """One row's forward: `tokens` appended to `runner`. With a `hook` (a block drafter's), the
    forward also leaves the hook's rows of these tokens `[1, w, F]` in `features`."""

    runner: ModelRunner
    tokens: Tokens
    hook: FeatureHook | None = None
    features: list[mx.array] = field(default_factory=list)

    @property
    def width(self) -> int:
        return int(self.tokens.size) if isinstance(self.tokens, mx.array) else len(self.tokens)


def forward(rows: Sequence[RowForward]) -> list[mx.array]:
    """Logits `[len(row.tokens), V]` for each row (lazy). Rows of several models may mix; only
    consecutive rows of one pooled model share a tick."""
    logits: list[mx.array] = []
    for group in _groups(rows):
        if rows[group.start].runner.pooled:
            logits.extend(_tick([rows[i] for i in group]))
        else:
            logits.extend(_own(rows[i]) for i in group)
    return logits


def measured_forward(rows: Sequence[RowForward]) -> list[mx.array]:
    """`forward(rows)` of rows of one model, evaluated now, its seconds recorded against its
    positions in the model's `ForwardCost` (what the width policy reads). A batch's rows are
    judged on its logits straight after, so evaluating here costs the tick nothing."""
    started = time.perf_counter()
    logits = forward(rows)
    mx.eval(logits)
    positions = sum(int(logit.shape[0]) for logit in logits)
    cost_of(rows[0].runner.model).observe(positions, time.perf_counter() - started)
    return logits


def batching(model: nn.Module) -> str:
    """`rows` where this model's rows share ticks, else `per-row (why)`: for the startup event."""
    reason = prepared(model).unpooled()
    return "rows" if reason is None else f"per-row ({reason})"


def _groups(rows: Sequence[RowForward]) -> list[range]:
    """Consecutive rows of one pooled model packed while their tokens fit in `row_stable_rows()`
    (a wider row goes alone); rows of other models one by one. Keeping row order keeps the taps'
    records in the order solo forwards make them."""
    limit = backend().row_stable_rows
    groups: list[range] = []
    start, total = 0, 0
    for i, row in enumerate(rows):
        width = row.width
        same = i > start and row.runner.model is rows[start].runner.model
        if i > start and (not (same and row.runner.pooled) or total + width > limit):
            groups.append(range(start, i))
            start, total = i, 0
        total += width
        if not row.runner.pooled:
            groups.append(range(i, i + 1))
            start, total = i + 1, 0
    if start < len(rows):
        groups.append(range(start, len(rows)))
    return groups


def _tick(rows: list[RowForward]) -> list[mx.array]:
    runners = [row.runner for row in rows]
    hooks = [row.hook.names if row.hook is not None else () for row in rows]
    ticked = [runner.at(row.tokens) for runner, row in zip(runners, rows, strict=True)]
    logits, features = forward_rows(runners[0].record, ticked, hooks)
    for runner, row, feature in zip(runners, rows, features, strict=True):
        runner.advance(row.width)
        if feature is not None:
            row.features.append(feature)
    return logits


def _own(row: RowForward) -> mx.array:
    """A row of a model whose rows keep their own caches: its own forward (its hook captured)."""
    if row.hook is None:
        return row.runner.forward(row.tokens)
    with row.hook.capture() as features:
        logits = row.runner.forward(row.tokens)
    row.features.extend(features)
    return logits
