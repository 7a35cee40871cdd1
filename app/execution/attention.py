"""What mlx-lm's modules see of the KV pool in a tick: one cache object per layer, and one attention
call per layer over every row of the tick.

A tick runs the rows' tokens as a batch of N one-token sequences `[N, 1]` through mlx-lm's own
model module. Each layer's cache is a `PoolLayer`: its `offset` is every token's absolute
position (RoPE takes one per batch entry), `make_mask` hands back the layer's window (mlx-lm asks
with `window_size` for sliding layers), and `update_and_fetch` writes all the tokens' keys and
values into the pool with one scatter and hands back the pool. The architecture module's
`scaled_dot_product_attention` is our dispatcher (installed by app/execution/prepare.py): for a
`PoolLayer` it runs `PoolLayer.attend`, one call for every query of the tick, each query seeing
its own row's keys from its window's start to its own position; for any other cache it is
mlx-lm's function (or, inside the project's exact forwards on CUDA, the row kernel).

Three ways to attend, chosen per model when it is prepared (`Attending`):

- `KERNEL` (CUDA, exact): the row-invariant kernel walks each query's keys in the pool, key j
  to warp j mod 16 (app/runtime/row_attention.cu): a query's bits depend on its vector and the
  keys it sees only.
- `ROWS` (CPU, exact): queries regrouped by row `[R, kv_heads, group * W, D]` (decode and verify
  rows in one group, prompt chunks in another, so a chunk does not widen every row), each row's keys
  `[R, kv_heads, L, D]` gathered up to the longest row's length L; scores by the BLAS shim's
  row-stable product (a dot product over D in a fixed order, whatever the shapes), masked to
  `-inf`, the maximum (exact in any order), `exp`, and one product of the weights with `[values,
  1]`, whose K loop (over keys) runs in order with one fused multiply-add per key
  (app/runtime/sgemm_rows.c): keys past a query's position weigh exactly 0 and leave its sums
  as they were, so neither L nor the padded width W changes a query's bits.
- `STOCK` (`execution.exact = false`): the same regrouping through MLX's
  `scaled_dot_product_attention` with a boolean mask: MLX's kernels, whose reductions depend on
  the shapes, so a row's bits may depend on its batch-mates.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

import mlx.core as mx

from app.execution import row_invariant


class Attending(StrEnum):
    KERNEL = "kernel"
    ROWS = "rows"
    STOCK = "stock"


@dataclass(frozen=True)
class RowGroup:
    """Rows of a tick regrouped (`ROWS`, `STOCK`): R rows of W places each."""

    slots: mx.array  # [R] each row's slot
    gather: mx.array  # [R * W] the token at each place (a row's padding places repeat its first token)
    positions: mx.array  # [R * W] each place's position (0 for padding places: they see key 0 alone)
    keys: mx.array  # [L] 0 .. L - 1: the positions attended, up to the longest row's length

    @property
    def rows(self) -> int:
        return int(self.slots.shape[0])

    @property
    def width(self) -> int:
        return int(self.gather.shape[0]) // self.rows


@dataclass(frozen=True)
class RowLayout:
    """The tick's rows in groups of like widths (decode and verify rows, and prompt chunks, so
    one row's chunk does not widen every other row's places), and each token's place in the
    groups' places one after another."""

    groups: tuple[RowGroup, ...]
    back: mx.array  # [N] each token's place


@dataclass(frozen=True)
class Placement:
    """Where each token of a tick sits in the pool (arrays, lazy; inputs of a compiled step)."""

    positions: mx.array  # [N] each token's absolute position
    slots: mx.array  # [N] its row's slot
    attending: Attending
    layout: RowLayout | None = None  # for ROWS and STOCK
    _derived: dict[tuple, mx.array] = field(default_factory=dict, compare=False)

    def write_index(self, kv_heads: int, capacity: int) -> mx.array:
        """[N * kv_heads]: where token t's head h goes in a layer's buffer seen as `[slots * kv_heads
        * capacity, D]` (made once per tick and shape)."""
        key = ("write", kv_heads, capacity)
        if key not in self._derived:
            heads = mx.arange(kv_heads, dtype=mx.int32)
            rows = (self.slots[:, None] * kv_heads + heads[None, :]) * capacity + self.positions[:, None]
            self._derived[key] = rows.reshape(-1)
        return self._derived[key]

    def first_key(self, window: int | None) -> mx.array:
        """[N] the first key each token sees: 0, or its window's start."""
        key = ("first", window)
        if key not in self._derived:
            if window is None:
                self._derived[key] = mx.zeros_like(self.positions)
            else:
                self._derived[key] = mx.maximum(self.positions - (window - 1), 0)
        return self._derived[key]

    def visible(self) -> mx.array:
        """[N] one past the last key each token sees: its own position's."""
        key = ("visible",)
        if key not in self._derived:
            self._derived[key] = self.positions + 1
        return self._derived[key]

    def seen(self, index: int, window: int | None, group: int) -> mx.array:
        """[R, 1, group * W, L]: which keys each place of row group `index` sees (its row's keys
        up to its position, in its window), in the places' order (g, i) of `_rows_exact`."""
        key = ("seen", index, window, group)
        if key not in self._derived:
            assert self.layout is not None
            rows = self.layout.groups[index]
            positions = rows.positions.reshape(rows.rows, 1, 1, rows.width, 1)
            keys = rows.keys.reshape(1, 1, 1, 1, -1)
            seen = keys <= positions
            if window is not None:
                seen = seen & (keys > positions - window)
            length = keys.shape[-1]
            seen = mx.broadcast_to(seen, (rows.rows, 1, group, rows.width, length))
            self._derived[key] = seen.reshape(rows.rows, 1, group * rows.width, length)
        return self._derived[key]


@dataclass(frozen=True)
class Window:
    """The mask a pool layer hands the model: its sliding window (None: every earlier key)."""

    size: int | None


class PoolLayer:
    """One decoder layer's cache for a tick: its pool buffers and where the tick's tokens go."""

    def __init__(self, keys: mx.array, values: mx.array, placement: Placement) -> None:
        self.keys = keys
        self.values = values
        self.placement = placement

    @property
    def offset(self) -> mx.array:
        return self.placement.positions

    def make_mask(self, n: int, window_size: int | None = None, return_array: bool = False) -> Window:
        assert n == 1, "a tick holds one token per sequence"
        return Window(window_size)

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Write the tokens' keys and values `[N, kv_heads, 1, D]` into the pool: one scatter each."""
        slots, heads, capacity, dim = self.keys.shape
        index = self.placement.write_index(heads, capacity)
        flat_keys, flat_values = self.keys.reshape(-1, dim), self.values.reshape(-1, dim)
        flat_keys[index] = keys.reshape(-1, dim).astype(flat_keys.dtype)
        flat_values[index] = values.reshape(-1, dim).astype(flat_values.dtype)
        self.keys = flat_keys.reshape(slots, heads, capacity, dim)
        self.values = flat_values.reshape(slots, heads, capacity, dim)
        return self.keys, self.values

    def attend(self, queries: mx.array, scale: float, mask: object, sinks: object) -> mx.array:
        """Every query `[N, heads, 1, D]` over its own row's keys in the pool, in one call."""
        if sinks is not None:
            raise NotImplementedError("attention sinks do not run on the KV pool")
        window = mask.size if isinstance(mask, Window) else None
        placement = self.placement
        if placement.attending is Attending.KERNEL:
            return row_invariant.pool_attention(
                queries,
                self.keys,
                self.values,
                placement.slots,
                placement.first_key(window),
                placement.visible(),
                scale,
            )
        layout = placement.layout
        assert layout is not None
        exact = placement.attending is Attending.ROWS
        attend = _rows_exact if exact else _rows_stock
        n, heads, _, dim = queries.shape
        group = heads // self.keys.shape[1] if exact else 1  # the exact path's places, (g, i) per kv head
        flat = queries.reshape(n, heads, dim)
        places = [
            attend(flat[rows.gather], self.keys, self.values, rows, placement.seen(i, window, group), scale)
            for i, rows in enumerate(layout.groups)
        ]
        out = places[0] if len(places) == 1 else mx.concatenate(places)  # [places, H, D]
        return out[layout.back][:, :, None, :]


# A slot longer than this many times the keys a tick reads is gathered as a strided slice: copying
# the whole slot costs more than the slower gather once the pool has grown for a long row (8,192
# positions against 40 read: 47 ms a layer's copy against 0.4; at 256 against 40, 0.09 against 0.24).
WHOLE_SLOT_RATIO = 16


def _row_keys(buffer: mx.array, rows: RowGroup) -> mx.array:
    """Each row's first L positions `[R, kv_heads, L, D]`: its whole slot copied (one contiguous
    copy per row, far cheaper than gathering a strided slice) while the slot is short, else just
    its first L positions gathered. The same values either way: the choice moves no bit."""
    length = rows.keys.shape[0]
    if buffer.shape[2] > WHOLE_SLOT_RATIO * length:
        return mx.take(buffer[:, :, :length], rows.slots, axis=0)
    return mx.take(buffer, rows.slots, axis=0)[:, :, :length]


def _rows_exact(
    queries: mx.array, keys: mx.array, values: mx.array, rows: RowGroup, seen: mx.array, scale: float
) -> mx.array:
    """The CPU's exact attention (see the module's docstring: `ROWS`) of one row group's places
    `[R * W, H, D]`: their outputs, in the same order."""
    count, width = rows.rows, rows.width
    heads, dim, kv_heads = queries.shape[1], queries.shape[2], keys.shape[1]
    group = heads // kv_heads
    q = queries.reshape(count, width, heads, dim) * scale  # H = kv_heads * group
    q = q.reshape(count, width, kv_heads, group, dim).transpose(0, 2, 3, 1, 4).reshape(count, kv_heads, -1, dim)
    row_keys, row_values = _row_keys(keys, rows), _row_keys(values, rows)
    scores = q @ row_keys.swapaxes(-1, -2)  # [R, kv_heads, group * W, L]
    scores = mx.where(seen, scores, -mx.inf)
    weights = mx.exp(scores - scores.max(axis=-1, keepdims=True))
    # Both sums as products whose K loop runs over the keys in order: a batched column of ones
    # (one product per row and head, as every product here: never one product of all rows)
    ones = mx.ones((*row_values.shape[:3], 1), row_values.dtype)
    out = (weights @ row_values) / (weights @ ones)
    out = out.reshape(count, kv_heads, group, width, dim).transpose(0, 3, 1, 2, 4)
    return out.reshape(count * width, heads, dim)


def _rows_stock(
    queries: mx.array, keys: mx.array, values: mx.array, rows: RowGroup, seen: mx.array, scale: float
) -> mx.array:
    """MLX's own attention over one row group's places (`STOCK`)."""
    heads, dim = queries.shape[1], queries.shape[2]
    q = queries.reshape(rows.rows, rows.width, heads, dim).transpose(0, 2, 1, 3)  # [R, H, W, D]
    out = mx.fast.scaled_dot_product_attention(
        q, _row_keys(keys, rows), _row_keys(values, rows), scale=scale, mask=seen
    )
    return out.transpose(0, 2, 1, 3).reshape(rows.rows * rows.width, heads, dim)


def dispatcher(original: Callable[..., mx.array]) -> Callable[..., mx.array]:
    """The architecture module's attention function: the pool's for a `PoolLayer`, the row kernel
    where an exact forward's own cache takes it (CUDA), else mlx-lm's `original`."""

    def attention(queries, keys, values, cache, scale, mask, sinks=None):  # noqa: ANN001, ANN202
        if isinstance(cache, PoolLayer):
            return cache.attend(queries, scale, mask, sinks)
        if row_invariant.takes(queries.shape, keys, cache, mask, sinks):
            return row_invariant.row_attention(queries, keys, values, scale)
        return original(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)

    return attention
