"""Many rows' steps advanced together: the forwards they ask for, served model by model in one pass.

Each row's step is a generator of `Forward` requests (app/drafters/base.py). Every round, the
rows waiting on a forward are grouped by model and each group goes through one `forward`;
drafting forwards (a draft model's step j of every row) are served before any target forward, so
all rows' target forwards of a tick end up in one pass. Each row judges, samples and draws keys
in its own generator in the order it would alone, so its output never depends on its batch-mates.

A row whose step raises fails alone: its exception is its result. A failed batched forward fails
the rows of that group (their caches may be half advanced).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import TypeVar

import mlx.core as mx

from app.drafters.base import Forward, Steps
from app.execution.forward import forward, measured_forward

T = TypeVar("T")


def run_together(steps: Sequence[Steps[T]]) -> list[T | Exception]:
    """Run every step to its end; each one's result, or the exception that ended it."""
    results: list[T | Exception | None] = [None] * len(steps)
    waiting: dict[int, Forward] = {}

    def resume(index: int, logits: mx.array | None) -> None:
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
        served = drafting or list(waiting)
        for group in _by_model(served, waiting):
            requests = [waiting.pop(i) for i in group]
            try:
                # a draft model's chain stays lazy (its next step is queued meanwhile), and so do
                # the next steps pipelining rows queue (`ahead`): both go to the device at once
                if drafting or all(request.ahead for request in requests):
                    logits = forward(requests)
                    mx.async_eval(logits)
                else:  # the rows judge on these logits next; their cost is what the width policy weighs
                    logits = measured_forward(requests)
            except Exception as exc:
                for i in group:
                    steps[i].close()
                    results[i] = exc
                continue
            for i, row_logits in zip(group, logits, strict=True):
                resume(i, row_logits)
    return results  # type: ignore[return-value]  # every step has ended


def _by_model(indices: list[int], waiting: dict[int, Forward]) -> list[list[int]]:
    """The rows' indices grouped by the model their forward runs on (one pass per model)."""
    groups: dict[int, list[int]] = defaultdict(list)
    for i in indices:
        groups[id(waiting[i].runner.model)].append(i)
    return list(groups.values())
