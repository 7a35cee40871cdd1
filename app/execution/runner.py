"""One row of a model: its place in the model's KV pool (or a cache of its own), forwards, rewinds.

A model whose rows share the KV pool (app/execution/prepare.py says which) gives each runner a
slot; the runner's forward is a tick of that one row (app/execution/tick.py), the same step a
batched tick of many rows runs, so a row computes the same bits alone or with others. Its
rewind lowers its length. Any other model (an architecture not checked to batch, a wrapped
layer, `max_kv_size`, a tensor-parallel target) keeps mlx-lm's own cache per runner and runs
mlx-lm's forward inside `row_invariant.exact_forward()`: on the GPU a width-w forward then gives
the bits of w single-token steps (app/execution/row_invariant.py says how), on the CPU the
BLAS shim does.

On rank 0 of a tensor-parallel target (app/execution/lockstep.py) each forward and rewind is also
ordered to the follower ranks, which repeat it on their shards; such a forward is evaluated at once.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from contextlib import nullcontext

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache, can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache

from app.execution import row_invariant
from app.execution.pool import Layers
from app.execution.prepare import prepared
from app.execution.tick import TickRow, Tokens, forward_rows
from app.loading.checkpoint import ModelLoadError

# Prefill cuts a prompt at absolute multiples of this: the one place the chunks are decided. A
# forward's bits may depend on how a prompt is cut (a prefill chunk attends to the keys before it
# in one product), so fixed cuts make the KV of a prompt's first k chunks the same in every prompt
# that starts with them: what lets the prompt cache (prompt_cache.py) reuse them exactly. 128
# rather than 512: the same prefill speed on the CPU (measured), and a finer grain for the cache.
PREFILL_CHUNK = 128


def chunk_end(start: int) -> int:
    """Where the prefill chunk that starts at `start` ends (at the latest)."""
    return (start // PREFILL_CHUNK + 1) * PREFILL_CHUNK


class ModelRunner:
    """Owns one row of one model. `length` counts the positions it holds."""

    def __init__(self, model: nn.Module, max_kv_size: int | None = None) -> None:
        self.model = model
        self.record = prepared(model)
        self.length = 0
        self.max_kv_size = max_kv_size
        self.lockstep = self.record.lockstep
        self.pool = self.record.pool() if _pooled(model, max_kv_size) else None
        self.cache = None if self.pool is not None else make_prompt_cache(model, max_kv_size=max_kv_size)
        self.slot = self.pool.acquire() if self.pool is not None else -1
        if self.pool is not None:
            weakref.finalize(self, self.pool.release, self.slot)

    @property
    def pooled(self) -> bool:
        return self.pool is not None

    @property
    def can_rewind(self) -> bool:
        return self.pool is not None or can_trim_prompt_cache(self.cache)

    def require_rewindable(self, role: str) -> None:
        require_rewindable(self.model, role, self.max_kv_size)

    def forward(self, tokens: Tokens) -> mx.array:
        """Logits `[T, V]` for T new tokens appended to the row (lazy, but evaluated on a tensor-parallel target)."""
        if self.pool is not None:
            (logits,), _ = forward_rows(self.record, [self.at(tokens)], [()])
            self.advance(len(tokens) if not isinstance(tokens, mx.array) else int(tokens.size))
            return logits
        inputs = tokens if isinstance(tokens, mx.array) else mx.array(list(tokens), dtype=mx.int32)
        if self.lockstep is None:
            return self._forward(inputs)
        with self.lockstep.forward(self, inputs, self.max_kv_size) as shared:
            logits = self._forward(shared)
            mx.eval(logits)  # its collectives run now, before rank 0 orders anything else
        return logits

    def at(self, tokens: Tokens) -> TickRow:
        """This row's part of a tick that appends `tokens` (a pooled row)."""
        return TickRow(self.slot, self.length, tokens)

    def advance(self, n: int) -> None:
        """A tick appended n positions to this row."""
        self.length += n

    def _forward(self, inputs: mx.array) -> mx.array:
        """mlx-lm's forward on the row's own cache; an open capture of the model's taps gets its rows."""
        taps = self.record.taps
        names = taps.wanted if taps is not None else ()
        exact = row_invariant.exact_forward() if self.record.exact else nullcontext()
        with exact, taps.collecting(names) if names else nullcontext({}) as seen:
            logits = self.model(inputs.reshape(1, -1), cache=self.cache)[0]
        for name in names:
            taps.deliver(name, seen[name], [(0, int(inputs.size))])
        self.length += int(inputs.size)
        return logits

    def prefill(self, tokens: Sequence[int]) -> mx.array:
        """Feed a prompt in chunks; return the last position's logits `[1, V]`."""
        while (logits := self.prefill_chunk(tokens)) is None:
            pass
        return logits

    def prefill_chunk(self, tokens: Sequence[int]) -> mx.array | None:
        """Feed the next chunk of a prompt whose first `length` tokens the row holds: the last
        position's logits `[1, V]` once the whole prompt is in, None while chunks remain.

        A chunk ends at the next multiple of PREFILL_CHUNK (a restored prefix ends on one). One
        call is one engine tick's worth of prefill, so a long prompt lets other rows advance
        between its chunks."""
        chunk, last = self.next_chunk(tokens)
        logits = self.forward(chunk)
        if not last:
            self.evaluate()
            return None
        return logits[-1:]

    def next_chunk(self, tokens: Sequence[int]) -> tuple[list[int], bool]:
        """The prompt's tokens this row's next prefill chunk feeds (to the next multiple of
        PREFILL_CHUNK), and whether they end the prompt."""
        end = chunk_end(self.length)
        return list(tokens[self.length : end]), len(tokens) <= end

    def evaluate(self) -> None:
        """Compute what the row's keys and values wait on now (a prefill chunk's, before the next)."""
        if self.pool is not None:
            self.pool.evaluate()
        else:
            mx.eval([c.state for c in self.cache])

    lookahead = 0  # a KV row depends on the tokens up to its own position only (the prompt cache's key)

    @property
    def can_restore(self) -> bool:
        """Every layer keeps plain KV rows, which a prompt cache entry can hand back (not on a
        tensor-parallel target: the followers' shards of the rows are not kept)."""
        return self.pool is not None or (self.lockstep is None and all(type(c) is KVCache for c in self.cache))

    def rows(self, n: int) -> Layers:
        """The first n positions of every layer's keys and values, copied out (the row goes on)."""
        return self.pool.copy_rows(self.slot, n) if self.pool is not None else copy_rows(self.cache, n)

    def restore(self, layers: Sequence[tuple[mx.array, mx.array]], n: int) -> None:
        """Start an empty row from the first n rows of each layer's (keys, values)."""
        assert self.length == 0 and self.can_restore
        if self.pool is not None:
            self.pool.write_rows(self.slot, layers, n)
        else:
            restore_rows(self.cache, layers, n)
        self.length = n

    def rewind(self, n: int) -> None:
        """Drop the last n positions."""
        if n <= 0:
            return
        if n > self.length:
            raise RuntimeError(f"cannot rewind {n} positions of a row holding {self.length}")
        if self.pool is None:
            if self.lockstep is not None:
                self.lockstep.rewind(self, n)
            trimmed = trim_prompt_cache(self.cache, n)
            if trimmed != n:
                raise RuntimeError(f"cache rewound {trimmed} rows instead of {n}")
        self.length -= n

    @property
    def cache_offset(self) -> int:
        """The positions the row's keys hold (what rewind arithmetic must keep equal to `length`)."""
        return self.length if self.pool is not None else int(self.cache[0].offset)


def _pooled(model: nn.Module, max_kv_size: int | None) -> bool:
    return max_kv_size is None and prepared(model).unpooled() is None


def reserve_rows(model: nn.Module, rows: int) -> None:
    """Room in the model's KV pool for `rows` rows at once (nothing for a model that keeps a cache
    per row): grown now rather than doubling under load, since every growth changes the shapes a
    GPU's compiled ticks were made for."""
    if _pooled(model, None):
        prepared(model).pool().reserve_slots(rows)


def require_rewindable(model: nn.Module, role: str, max_kv_size: int | None = None) -> None:
    """Speculation retracts rejected rows; refuse a model whose rows cannot give them back."""
    if _pooled(model, max_kv_size):
        return
    cache = make_prompt_cache(model, max_kv_size=max_kv_size)
    if not can_trim_prompt_cache(cache):
        kinds = sorted({type(c).__name__ for c in cache if not c.is_trimmable()})
        raise ModelLoadError(
            f"the {role} model's cache cannot be rewound ({', '.join(kinds)}), so it cannot take part in "
            "speculative decoding; run it without a drafter"
        )


def restorable(model: nn.Module, max_kv_size: int | None = None) -> bool:
    """Whether the model's rows can start from a prompt cache entry (plain KV rows)."""
    if _pooled(model, max_kv_size):
        return True
    record = prepared(model)
    return record.lockstep is None and all(type(c) is KVCache for c in make_prompt_cache(model, max_kv_size))


def copy_rows(caches: Sequence[KVCache], n: int) -> Layers:
    """The first n rows of each KV cache, copied out (evaluated: the caches go on changing)."""
    rows = [(mx.contiguous(c.keys[..., :n, :]), mx.contiguous(c.values[..., :n, :])) for c in caches]
    mx.eval(rows)
    return rows


def restore_rows(caches: Sequence[KVCache], layers: Sequence[tuple[mx.array, mx.array]], n: int) -> None:
    """Set empty KV caches to the first n rows of each layer's (keys, values).

    The caches get new arrays (slices of the given ones), so their own updates never reach them.
    Each buffer is padded to the capacity n appended rows would have grown (KVCache grows in
    steps), so the later forwards see the same buffers as after computing those rows."""
    for cache, (keys, values) in zip(caches, layers, strict=True):
        cache.state = (_padded(keys[..., :n, :]), _padded(values[..., :n, :]), n)


def _padded(rows: mx.array) -> mx.array:
    """`rows` `[B, heads, n, D]` with zero rows up to the next multiple of KVCache.step."""
    n = rows.shape[2]
    pad = -n % KVCache.step
    if pad == 0:
        return rows
    zeros = mx.zeros((*rows.shape[:2], pad, rows.shape[3]), rows.dtype)
    return mx.concatenate([rows, zeros], axis=2)
