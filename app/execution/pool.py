"""One model's KV rows in one pool: per layer, keys and values `[slots, kv_heads, capacity, head_dim]`.

A row of the model (a `ModelRunner`) holds a slot and a length; its keys at positions
`0 .. length - 1` are `keys[slot, :, :length]`. A tick writes every row's new keys and values with
one scatter per layer (app/execution/attention.py `PoolLayer`), and attention reads each row's
keys where they lie, so nothing is copied per row. Rewinding a row is lowering its length: the
rows past it are written over by its next forward, and no query ever sees past its own position.

Slots are contiguous: a row's keys are one strided run, which the GPU's attention kernel walks as
it walked a row's own cache, and which the CPU reads as one slice. Every slot has the same
capacity, grown by doubling (with a copy, once per doubling) when a row would outgrow it, so a
pool costs `slots x longest row`; pages would cost less with ragged lengths, at the price of a
page table in every walk and of a gather on the CPU (docs/architecture.md, "The KV pool").

Slot 0 is scratch: the padding tokens of a compiled shape bucket write there and read there, and
no row ever holds it, so padding cannot reach a real row. Which slot a row holds, who its
neighbours are and how large the pool is never change its bits: attention reads a row's keys by
position, in a fixed order, and only the keys its query may see (tests/execution/test_pool.py).

The arrays are replaced, never written in place by Python: MLX updates a buffer in place when
nothing else holds it, so anything that keeps a view of a pool array (a prompt-cache copy
must be a copy) would make every tick copy the whole pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx

from app.execution.device import keep_buffers

SCRATCH = 0  # the slot padding tokens use; never a row's
MIN_CAPACITY = 256  # rows per slot at first (a multiple of mlx-lm's KVCache step)
MIN_SLOTS = 4  # slots at first, scratch included; doubled when a row finds none free

Layers = list[tuple[mx.array, mx.array]]  # per layer: keys and values `[1, kv_heads, rows, head_dim]`


@dataclass(frozen=True)
class LayerShape:
    """What one layer's attention keeps per position."""

    kv_heads: int
    head_dim: int
    dtype: mx.Dtype


class KVPool:
    """The buffers, which slots are free, and each slot's capacity (one for all)."""

    def __init__(self, shapes: Sequence[LayerShape], slots: int = MIN_SLOTS, capacity: int = MIN_CAPACITY) -> None:
        self.shapes = list(shapes)
        self.keys = [mx.zeros((slots, s.kv_heads, capacity, s.head_dim), s.dtype) for s in self.shapes]
        self.values = [mx.zeros((slots, s.kv_heads, capacity, s.head_dim), s.dtype) for s in self.shapes]
        mx.eval(self.keys, self.values)
        keep_buffers(self.nbytes)
        self._free = list(range(slots - 1, SCRATCH, -1))  # popped from the end: the lowest slot first

    @property
    def slots(self) -> int:
        return int(self.keys[0].shape[0])

    @property
    def capacity(self) -> int:
        return int(self.keys[0].shape[2])

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in zip(self.keys, self.values, strict=True))

    @property
    def held(self) -> int:
        """Slots rows hold now."""
        return self.slots - 1 - len(self._free)

    def acquire(self) -> int:
        """A free slot for a new row (the pool doubles its slots when none is free)."""
        if not self._free:
            grown = self.slots
            self._grow(slots=2 * grown)
            self._free = list(range(2 * grown - 1, grown - 1, -1))
        return self._free.pop()

    def release(self, slot: int) -> None:
        self._free.append(slot)

    def reserve_slots(self, slots: int) -> None:
        """Room for `slots` rows at once (scratch aside), made now rather than by doubling later."""
        if slots + 1 > self.slots:
            grown = self.slots
            self._grow(slots=slots + 1)
            self._free = list(range(slots, grown - 1, -1)) + self._free

    def reserve(self, rows: int) -> None:
        """Make every slot hold at least `rows` positions (the capacity doubles until it does)."""
        capacity = self.capacity
        while capacity < rows:
            capacity *= 2
        if capacity > self.capacity:
            self._grow(capacity=capacity)

    def state(self) -> list[mx.array]:
        """Every layer's keys, then every layer's values: what a tick reads and replaces."""
        return [*self.keys, *self.values]

    def replace(self, state: Sequence[mx.array]) -> None:
        n = len(self.shapes)
        self.keys, self.values = list(state[:n]), list(state[n:])

    def copy_rows(self, slot: int, n: int) -> Layers:
        """The first n positions of a slot, per layer, as new arrays (evaluated: they hold no
        view of the pool, which would keep its buffers from being updated in place)."""
        index = mx.array([slot])
        rows = [
            (mx.contiguous(mx.take(k[:, :, :n], index, axis=0)), mx.contiguous(mx.take(v[:, :, :n], index, axis=0)))
            for k, v in zip(self.keys, self.values, strict=True)
        ]
        mx.eval(rows)
        return rows

    def write_rows(self, slot: int, layers: Sequence[tuple[mx.array, mx.array]], n: int) -> None:
        """Set a slot's first n positions to the first n rows of each layer's (keys, values)."""
        self.reserve(n)
        for i, (keys, values) in enumerate(layers):
            self.keys[i] = _written(self.keys[i], slot, keys[..., :n, :])
            self.values[i] = _written(self.values[i], slot, values[..., :n, :])
        mx.eval(self.keys, self.values)

    def evaluate(self) -> None:
        mx.eval(self.keys, self.values)

    def _grow(self, *, slots: int | None = None, capacity: int | None = None) -> None:
        """New buffers with the old contents at the same places (zeros elsewhere)."""
        slots, capacity = slots or self.slots, capacity or self.capacity

        def grown(old: mx.array) -> mx.array:
            new = mx.zeros((slots, old.shape[1], capacity, old.shape[3]), old.dtype)
            new[: old.shape[0], :, : old.shape[2]] = old
            return new

        self.keys = [grown(k) for k in self.keys]
        self.values = [grown(v) for v in self.values]
        mx.eval(self.keys, self.values)
        keep_buffers(self.nbytes)


def _written(buffer: mx.array, slot: int, rows: mx.array) -> mx.array:
    buffer[slot : slot + 1, :, : rows.shape[2]] = rows.astype(buffer.dtype)
    return buffer
