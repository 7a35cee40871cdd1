"""The step protocol: a row's step is a generator of the forwards (and drafter passes) it needs,
and the two ways they are served, a lone row's (`run_alone`) and many rows' together
(`run_together`), model by model in one pass.

Every round, the rows waiting are grouped by model and each group goes through one `forward`
(app/execution/forward.py) or one call of its passes' `serve`; drafting (a draft model's step j of
every row, a block drafter's pass of every row) is served before any target forward, so all rows'
target forwards of a tick end up in one pass. The rows' sampler work (`Draw`: a distribution and
its draws) is served next, one call for every row of a kind, and what rows read on the host
(`Evaluate`) is evaluated for every waiting row at once, after the drafting and the draws and
before the target's forwards. Each row draws keys in its own generator in the order it would
alone and gets its own rows of a draw served with its batch-mates', which are its lone rows bit
for bit, so its output never depends on its batch-mates (evaluating arrays together changes no
value in them either).

`run_together` returns the tick as a value, a `TickResult`: each row's outcome in the rows' order
and the tick's parts timed (app/execution/cost.py `TickClock`: the drafting phase, the target
forward, the rest; the tick's width choice prices the next ticks with them).

A row whose step raises fails alone: its exception is its result. A failed batched forward fails
the rows of that group (their caches may be half advanced).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Callable, Generator, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import mlx.core as mx

from app.execution.cost import TickClock
from app.execution.forward import RowForward, forward, measured_forward

if TYPE_CHECKING:
    import mlx.nn as nn

T = TypeVar("T")


@dataclass(frozen=True)
class Forward(RowForward):
    """A forward one row's step asks for: `tokens` appended to `runner`'s cache, logits sent back.

    `drafting` forwards (a draft model's steps) are served before the target's, so every row's
    target forward of a tick goes in one pass. An `ahead` forward is the next step's, queued
    before this step's token is read (its input is that token, still lazy): it is sent to the
    device at once and its logits are not waited for. `sampled`: the row's sampler draws here (its
    positions cost the sampler's work too, which the width policy prices apart).
    """

    drafting: bool = False
    ahead: bool = False
    sampled: bool = False


@dataclass(frozen=True)
class Evaluate:
    """Arrays a row's step reads on the host next (its verdict's tokens, its next token): the
    tick evaluates every waiting row's in one `mx.eval`, so a tick of many rows waits for the
    device once, not once per row (on a GPU each wait costs a launch and a synchronisation)."""

    arrays: tuple[mx.array, ...]
    drafting = False  # served after the drafting passes, before the target's forwards


class DraftPass(Protocol):
    """One row's share of a drafter call the tick's rows run as one (block drafters,
    app/drafters/block_rows.py); the passes of one `module` are served with one `serve` and each
    row is sent its own result."""

    drafting: bool  # always True: served before any target forward, as a draft model's steps
    module: nn.Module  # which drafter: its rows' passes share a call, and its costs are recorded
    sampled: bool  # the row's draft is drawn through its sampler (priced apart)

    @property
    def positions(self) -> int:
        """The row's tokens in this pass (what the pass's cost grows with)."""
        ...

    @staticmethod
    def serve(passes: Sequence[DraftPass]) -> list[object]:
        """Every pass's result, in order (lazy)."""
        ...


class Draw(ABC):
    """Sampler work one row's step asks for (app/sampling/draws.py `Sample`): the tick's waiting
    draws of one `kind` are served with one `serve`, each row sent its own result, so the work
    over the vocabulary runs once per kind of row and not once per row (on a GPU each of its
    dozens of operations is a launch). Lazy, like a drafting pass: served once the drafting
    passes are, before the evaluations that read what it drew."""

    drafting = False

    @property
    @abstractmethod
    def kind(self) -> Hashable:
        """Draws of equal kinds share one `serve`."""

    @staticmethod
    @abstractmethod
    def serve(draws: Sequence[Draw]) -> list[object]:
        """Every draw's result, in order (lazy)."""


# A step asks for forwards (logits come back), block drafters' passes and draws (their results come
# back) and evaluations (None comes back: its arrays are evaluated).
Steps = Generator[Forward | DraftPass | Draw | Evaluate, Any, T]


def run_alone(steps: Steps[T]) -> T:
    """Serve each forward, pass or draw a step asks for on its own; the step's result."""
    try:
        request = next(steps)
        while True:
            if isinstance(request, Evaluate):
                result = mx.eval(*request.arrays)
            elif isinstance(request, Forward):
                (result,) = forward([request])
                if request.ahead or request.drafting:  # computed while the step builds its next graph
                    mx.async_eval(result)
            else:
                (result,) = request.serve([request])
            request = steps.send(result)
    except StopIteration as done:
        return done.value


@dataclass(frozen=True)
class TickResult(Generic[T]):
    """What one tick of rows came to: each step's result, or the exception that ended it, in the
    steps' order (`outcomes`); the tick's parts timed (`clock`, closed) and its wall `seconds`."""

    outcomes: tuple[T | Exception, ...]
    clock: TickClock
    seconds: float


def run_together(steps: Sequence[Steps[T]]) -> TickResult[T]:
    """Run every step to its end, their forwards batched; the tick as a value (`TickResult`)."""
    started = time.perf_counter()
    results: list[T | Exception | None] = [None] * len(steps)
    waiting: dict[int, Forward | DraftPass | Draw | Evaluate] = {}
    clock = TickClock()

    def resume(index: int, logits: object) -> None:
        try:
            waiting[index] = steps[index].send(logits)
        except StopIteration as done:
            results[index] = done.value
        except Exception as exc:  # this row's failure, not its batch-mates'
            results[index] = exc

    for index in range(len(steps)):
        resume(index, None)
    while waiting:
        drafting = [i for i, request in waiting.items() if request.drafting]
        # draws once no drafting pass is left to serve (a drafting row's next asks for one, which
        # joins the others'), then evaluations before the forwards (a row resumed may still ask
        # for one that joins the others')
        drawing = [] if drafting else [i for i, request in waiting.items() if isinstance(request, Draw)]
        evaluating = [] if drafting or drawing else [i for i, r in waiting.items() if isinstance(r, Evaluate)]
        if not drafting and not drawing and not evaluating:
            clock.drafts_read([r.tokens for r in waiting.values() if isinstance(r.tokens, mx.array)])
        if evaluating:
            groups = [evaluating]
        elif drawing:
            groups = _grouped(drawing, waiting, lambda draw: draw.kind)
        else:
            groups = _grouped(drafting or list(waiting), waiting, _model)
        for group in groups:
            requests = [waiting.pop(i) for i in group]
            try:
                if evaluating:  # every waiting row's host reads in one wait
                    mx.eval(*[array for request in requests for array in request.arrays])
                    logits = [None] * len(requests)
                elif drawing:  # lazy: the rows read their tokens with the tick's evaluations
                    logits = requests[0].serve(requests)
                elif drafting:
                    logits = _drafted(requests, clock)
                elif all(request.ahead for request in requests):
                    # the next steps pipelining rows queue (`ahead`) go to the device at once; their
                    # rows read them next tick, so nothing here waits for them or times them
                    logits = forward(requests)
                    mx.async_eval(logits)
                else:
                    logits = _forwarded(requests, clock)
            except Exception as exc:
                for i in group:
                    steps[i].close()
                    results[i] = exc
                continue
            for i, row_logits in zip(group, logits, strict=True):
                resume(i, row_logits)
    clock.close()
    return TickResult(tuple(results), clock, time.perf_counter() - started)  # type: ignore[arg-type]  # every step ended


def _drafted(requests: list, clock: TickClock) -> list:
    """One drafting pass of these rows (one model's): lazy, so the rows build their next pass meanwhile."""
    if isinstance(requests[0], Forward):
        model, sizes, outputs = requests[0].runner.model, [_size(r.tokens) for r in requests], forward(requests)
    else:
        model, sizes, outputs = requests[0].module, [r.positions for r in requests], requests[0].serve(requests)
    mx.async_eval(outputs)
    clock.drafted(model, sum(sizes), sum(size for size, r in zip(sizes, requests, strict=True) if r.sampled))
    return outputs


def _forwarded(requests: list[Forward], clock: TickClock) -> list[mx.array]:
    """The rows' target forward: they judge on its logits next; its cost is what the width policy weighs."""
    started = time.perf_counter()
    logits = measured_forward(requests)
    positions = [int(row_logits.shape[0]) for row_logits in logits]
    clock.forwarded(requests[0].runner.model, positions, [r.sampled for r in requests], time.perf_counter() - started)
    return logits


def _size(tokens: object) -> int:
    return int(tokens.size) if isinstance(tokens, mx.array) else len(tokens)


def _model(request: Forward | DraftPass) -> int:
    """Which model a forward (or pass) runs on: one call per model."""
    return id(request.runner.model if isinstance(request, Forward) else request.module)


def _grouped(indices: list[int], waiting: dict, key: Callable[[Any], Hashable]) -> list[list[int]]:
    """The rows' indices grouped by `key` of their request, each group served by one call."""
    groups: dict[Hashable, list[int]] = defaultdict(list)
    for i in indices:
        groups[key(waiting[i])].append(i)
    return list(groups.values())
