"""A model with its KV cache: forward rows, rewind rows.

Forwards run inside `row_invariant.exact_forward()`, so on the GPU a width-w forward gives the bits
of w single-token steps (app/loading/row_invariant.py says how); on the CPU the BLAS shim does.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache

from app.loading import row_invariant
from app.loading.checkpoint import ModelLoadError

PREFILL_CHUNK = 512


class ModelRunner:
    """Owns one row's cache for one model. `length` counts the tokens the cache holds."""

    def __init__(self, model: nn.Module, max_kv_size: int | None = None) -> None:
        self.model = model
        self.cache = make_prompt_cache(model, max_kv_size=max_kv_size)
        self.length = 0

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

    def forward(self, tokens: Sequence[int] | mx.array) -> mx.array:
        """Logits `[T, V]` for T new tokens appended to the cache (lazy; not evaluated)."""
        inputs = tokens if isinstance(tokens, mx.array) else mx.array(list(tokens), dtype=mx.int32)
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

        One call is one engine tick's worth of prefill, so a long prompt lets other rows advance
        between its chunks."""
        rest = list(tokens[self.length :])
        if len(rest) > PREFILL_CHUNK:
            self.forward(rest[:PREFILL_CHUNK])
            mx.eval([c.state for c in self.cache])
            return None
        return self.forward(rest)[-1:]

    def rewind(self, n: int) -> None:
        """Drop the last n rows of the cache."""
        if n <= 0:
            return
        trimmed = trim_prompt_cache(self.cache, n)
        if trimmed != n:
            raise RuntimeError(f"cache rewound {trimmed} rows instead of {n}")
        self.length -= n

    @property
    def cache_offset(self) -> int:
        """The first layer's own count of cached rows (what rewind arithmetic must keep equal)."""
        return int(self.cache[0].offset)
