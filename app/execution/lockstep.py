"""Rank 0's orders to the follower ranks of a tensor-parallel target, over mx.distributed only.

Under tensor parallelism (app/execution/tensor_parallel.py) every rank holds a shard of the target
and each forward's sharded products meet in all_sum collectives, so every rank must run the same
forwards on the same rows in the same order. Rank 0 decides them (HTTP, scheduling, sampling and
the drafter live there alone); before each target forward or cache rewind it sends the order as a
collective too: an all_sum of a header in which the followers put zeros, then, for a forward, an
all_sum of its tokens that rank 0 itself feeds to the model, so both sides run the same graph.

One order at a time: a lock keeps the engine thread's forwards and the final stop apart, and rank
0 evaluates each forward before it sends anything else, so the collectives of two orders never
interleave. Runners are named by a number given on their first forward; one that rank 0 drops is
freed on the followers with the next order (weakref.finalize only notes it: a finalizer may run
on any thread, never in the middle of an order).
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import IntEnum
from itertools import count
from typing import Any

import mlx.core as mx


class Order(IntEnum):
    STOP = 0  # rank 0 is shutting down: the followers return
    FORWARD = 1  # runner, max_kv_size (0: none), then the tokens
    REWIND = 2  # runner, rows to drop
    FREE = 3  # then the numbers of the runners rank 0 dropped


HEADER = 4  # order, runner, argument, payload length


@dataclass(frozen=True)
class Received:
    order: Order
    runner: int
    argument: int
    payload: mx.array | None  # a FORWARD's tokens or FREE's runner numbers


class RanksStoppedError(RuntimeError):
    """A forward asked for after the followers were told to stop."""


class LockstepBrokenError(BaseException):
    """An order that failed (a lost rank, a failed forward) leaves the ranks out of step, so no later
    forward can be trusted: the engine's failure, not one row's. A BaseException, like SystemExit,
    so the per-row handlers let it through to the engine's supervision (exit 1, 503s)."""


class Lockstep:
    """The orders' channel on one group; rank 0 sends (`forward`, `rewind`, `stop`), the others `receive`."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self._lock = threading.Lock()
        self._names: weakref.WeakKeyDictionary[object, int] = weakref.WeakKeyDictionary()
        self._numbers = count(1)
        self._dropped: list[int] = []
        self._stopped = False

    # --- rank 0 --------------------------------------------------------------------------------

    @contextmanager
    def forward(self, runner: object, tokens: mx.array, max_kv_size: int | None) -> Iterator[mx.array]:
        """Order a forward of `tokens` on `runner`'s mirror; yields the tokens as the collective hands
        them to every rank. The caller runs and evaluates the forward inside the block."""
        with self._order(Order.FORWARD, self._name(runner), max_kv_size or 0, tokens.reshape(-1)) as shared:
            yield shared

    def rewind(self, runner: object, n: int) -> None:
        if runner in self._names:  # a runner that never ran forward has nothing to rewind on the followers
            with self._order(Order.REWIND, self._names[runner], n):
                pass

    def stop(self) -> None:
        """Tell the followers to return (once); later orders raise RanksStoppedError."""
        with self._lock:
            if not self._stopped:
                self._stopped = True
                with contextlib.suppress(RuntimeError):  # a follower the ring lost needs no stop
                    self._send(Order.STOP, 0, 0, None)

    def _name(self, runner: object) -> int:
        if runner not in self._names:
            number = next(self._numbers)
            self._names[runner] = number
            weakref.finalize(runner, self._dropped.append, number)
        return self._names[runner]

    @contextmanager
    def _order(self, order: Order, runner: int, argument: int, payload: mx.array | None = None) -> Iterator[Any]:
        with self._lock:
            if self._stopped:
                raise RanksStoppedError("the tensor-parallel ranks were stopped")
            try:
                if self._dropped:
                    dropped, self._dropped[:] = list(self._dropped), []
                    self._send(Order.FREE, 0, 0, mx.array(dropped, dtype=mx.int32))
                yield self._send(order, runner, argument, payload)
            except Exception as exc:
                self._stopped = True  # a stop order now could pair with a follower's half-done forward
                raise LockstepBrokenError(f"the tensor-parallel ranks fell out of step: {exc}") from exc

    def _send(self, order: Order, runner: int, argument: int, payload: mx.array | None) -> mx.array | None:
        length = 0 if payload is None else int(payload.size)
        mx.eval(self._all_sum(mx.array([order, runner, argument, length], dtype=mx.int32)))
        if payload is None:
            return None
        shared = self._all_sum(payload.astype(mx.int32))
        if order is not Order.FORWARD:
            mx.eval(shared)  # a forward's tokens are evaluated with the forward that reads them
        return shared

    # --- followers -----------------------------------------------------------------------------

    def receive(self) -> Received:
        """The next order (blocks until rank 0 sends one); a FORWARD's payload is lazy: evaluate it
        with the forward, as rank 0 does."""
        order, runner, argument, length = self._all_sum(mx.zeros(HEADER, dtype=mx.int32)).tolist()
        payload = self._all_sum(mx.zeros(length, dtype=mx.int32)) if length else None
        if payload is not None and order != Order.FORWARD:
            mx.eval(payload)
        return Received(Order(order), runner, argument, payload)

    def _all_sum(self, values: mx.array) -> mx.array:
        return mx.distributed.all_sum(values, group=self.group)
