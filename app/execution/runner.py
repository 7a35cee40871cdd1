"""A model with its KV cache: forward rows, rewind rows.

Forwards run inside `row_invariant.exact_forward()`, so on the GPU a width-w forward gives the bits
of w single-token steps (app/execution/row_invariant.py says how); on the CPU the BLAS shim does.

On rank 0 of a tensor-parallel target (app/execution/lockstep.py) each forward and rewind is also
ordered to the follower ranks, which repeat it on their shards; such a forward is evaluated at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache, can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache

from app.execution import row_invariant
from app.execution.lockstep import lockstep_of
from app.loading.checkpoint import ModelLoadError

Tokens = Sequence[int] | mx.array

# Prefill cuts a prompt at absolute multiples of this. A forward's bits may depend on how a prompt
# is cut (on the GPU, and on the CPU for products longer than the shim's row-stable limit), so
# fixed cuts make the KV of a prompt's first k chunks the same in every prompt that starts with
# them: what lets the prompt cache (prompt_cache.py) reuse them exactly. 128 rather than 512: the
# same prefill speed on the CPU (measured), and a finer grain for the cache to reuse.
PREFILL_CHUNK = 128


def chunk_end(start: int) -> int:
    """Where the prefill chunk that starts at `start` ends (at the latest)."""
    return (start // PREFILL_CHUNK + 1) * PREFILL_CHUNK


class ModelRunner:
    """Owns one row's cache for one model. `length` counts the tokens the cache holds."""

    def __init__(self, model: nn.Module, max_kv_size: int | None = None) -> None:
        self.model = model
        self.cache = make_prompt_cache(model, max_kv_size=max_kv_size)
        self.length = 0
        self.max_kv_size = max_kv_size
        self.lockstep = lockstep_of(model)

    @property
    def can_rewind(self) -> bool:
        return can_trim_prompt_cache(self.cache)

    def require_rewindable(self, role: str) -> None:
        """Speculation retracts rejected rows; refuse a cache that cannot give them back."""
        if not self.can_rewind:
            kinds = sorted({type(c).__name__ for c in self.cache if not c.is_trimmable()})
            raise ModelLoadError(
                f"the {role} model's cache cannot be rewound ({', '.join(kinds)}), so it cannot take part in "
                "speculative decoding; run it without a drafter"
            )

    def forward(self, tokens: Tokens) -> mx.array:
        """Logits `[T, V]` for T new tokens appended to the cache (lazy, but evaluated on a tensor-parallel target)."""
        inputs = tokens if isinstance(tokens, mx.array) else mx.array(list(tokens), dtype=mx.int32)
        if self.lockstep is None:
            return self._forward(inputs)
        with self.lockstep.forward(self, inputs, self.max_kv_size) as shared:
            logits = self._forward(shared)
            mx.eval(logits)  # its collectives run now, before rank 0 orders anything else
        return logits

    def _forward(self, inputs: mx.array) -> mx.array:
        with row_invariant.exact_forward():
            logits = self.model(inputs.reshape(1, -1), cache=self.cache)[0]
        self.length += int(inputs.size)
        return logits

    def prefill(self, tokens: Sequence[int]) -> mx.array:
        """Feed a prompt in chunks; return the last position's logits `[1, V]`."""
        while (logits := self.prefill_chunk(tokens)) is None:
            pass
        return logits

    def prefill_chunk(self, tokens: Sequence[int]) -> mx.array | None:
        """Feed the next chunk of a prompt whose first `length` tokens the cache holds: the last
        position's logits `[1, V]` once the whole prompt is in, None while chunks remain.

        A chunk ends at the next multiple of PREFILL_CHUNK (a restored prefix ends on one). One
        call is one engine tick's worth of prefill, so a long prompt lets other rows advance
        between its chunks."""
        end = chunk_end(self.length)
        if len(tokens) > end:
            self.forward(list(tokens[self.length : end]))
            mx.eval([c.state for c in self.cache])
            return None
        return self.forward(list(tokens[self.length :]))[-1:]

    lookahead = 0  # a KV row depends on the tokens up to its own position only (the prompt cache's key)

    @property
    def can_restore(self) -> bool:
        """Every layer keeps plain KV rows, which a prompt cache entry can hand back (not on a
        tensor-parallel target: the followers' shards of the rows are not kept)."""
        return self.lockstep is None and all(type(c) is KVCache for c in self.cache)

    def restore(self, layers: Sequence[tuple[mx.array, mx.array]], n: int) -> None:
        """Start an empty cache from the first n rows of each layer's (keys, values)."""
        assert self.length == 0 and self.can_restore
        restore_rows(self.cache, layers, n)
        self.length = n

    def rewind(self, n: int) -> None:
        """Drop the last n rows of the cache."""
        if n <= 0:
            return
        if self.lockstep is not None:
            self.lockstep.rewind(self, n)
        trimmed = trim_prompt_cache(self.cache, n)
        if trimmed != n:
            raise RuntimeError(f"cache rewound {trimmed} rows instead of {n}")
        self.length -= n

    @property
    def cache_offset(self) -> int:
        """The first layer's own count of cached rows (what rewind arithmetic must keep equal)."""
        return int(self.cache[0].offset)


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
