"""Per-row random streams that replay MLX's default key sequence."""

from __future__ import annotations

import mlx.core as mx


class RowRng:
    """The key sequence `mx.random.seed(seed)` starts, kept per row.

    MLX's default stream splits its key on every draw and keeps the first half; this class does
    the same, so a seeded row draws exactly what a seeded process would, while concurrent rows of
    the server cannot disturb each other's draws.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._key = mx.random.key(seed)

    def next_key(self) -> mx.array:
        keys = mx.random.split(self._key)
        self._key = keys[0]
        return keys[1]

    def uniform(self) -> float:
        return mx.random.uniform(key=self.next_key()).item()

    def draw(self, probs: mx.array) -> mx.array:
        """One draw per probability row, left on the device (lazy)."""
        return mx.random.categorical(mx.log(probs), key=self.next_key())

    def categorical(self, probs: mx.array) -> int:
        """One draw from a probability row `[V]`, read back to the host."""
        return int(self.draw(probs).item())
