"""Per-row random streams that replay MLX's default key sequence."""

from __future__ import annotations

import random
from collections.abc import Sequence

import mlx.core as mx

KEY_RANGE = 2**64  # mx.random.key takes an unsigned 64-bit seed
RANDOM = -1  # llama-server's "pick a seed for me"


def resolve_seed(seed: int | None, choice: int = 0) -> int:
    """The key seed a requested seed means, the one place it is decided: absent or -1 draws a
    random one (`random_seed`); any other integer is taken modulo 2**64, the way a C client would
    wrap it, so every integer llama-server accepts is served. Choice `choice` of a request
    (OpenAI's `n`) adds its number to a given seed, so each choice of a seeded request replays
    alone with that seed; unseeded choices draw their own."""
    if seed is None or seed == RANDOM:
        return random_seed()
    return (seed + choice) % KEY_RANGE


def random_seed() -> int:
    """A fresh key seed: 32 bits, so that every JSON client reads it back exactly."""
    return random.getrandbits(32)


class RowRng:
    """The key sequence `mx.random.seed(seed)` starts, kept per row.

    MLX's default stream splits its key on every draw and keeps the first half; this class does
    the same, so a seeded row draws exactly what a seeded process would, while concurrent rows of
    the server cannot disturb each other's draws. `peek`/`advance` let a rule prepare the draws
    of a whole round in one evaluation yet consume keys only for the positions it tested.
    Categorical draws take a key from here (`Distribution.draw`).
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._key = mx.random.key(seed)
        self._peeked: list[mx.array] = []
        # (the stack of keys, this stream's row of it) while `_key` is that row, as `next_keys`
        # leaves it: a tick of the same rows in the same order splits the stack as it is
        self._stacked: tuple[mx.array, int] | None = None

    def next_key(self) -> mx.array:
        keys = mx.random.split(self._key)
        self._key, self._peeked, self._stacked = keys[0], [], None
        return keys[1]

    def peek(self, n: int) -> list[mx.array]:
        """The next n draw keys, without consuming them (lazy); `advance` consumes a prefix."""
        draw_keys, self._peeked = [], []
        for state, key in _splits(self._key, n):
            draw_keys.append(key)
            self._peeked.append(state)
        return draw_keys

    def ahead(self, n: int) -> list[mx.array]:
        """The next n draw keys, lazily, touching nothing: not even a pending `peek` (a coupled
        drafter reads the keys the target will draw with, app/sampling/streams.py)."""
        return [key for _, key in _splits(self._key, n)]

    def advance(self, n: int) -> None:
        """Consume the first n keys of the last `peek`."""
        if n:
            self._key, self._stacked = self._peeked[n - 1], None
        self._peeked = []

    def uniform(self) -> float:
        return mx.random.uniform(key=self.next_key()).item()

    @staticmethod
    def next_keys(streams: Sequence[RowRng]) -> mx.array:
        """Each stream's next key `[R, 2]`, the one its `next_key` would return, every stream
        advanced past it: one split of their keys stacked, not one per stream (a tick's sampled
        rows). MLX's random bits of a stack of keys are each key's own (tests/sampling/test_draws.py).
        The streams' keys are stacked only where they are not one stack already: the rows of the
        tick before, in its order, split what that tick left (on a GPU a stack is a copy per row)."""
        if len(streams) == 1:  # one row: its own split, as `next_key` makes it
            return streams[0].next_key()[None]
        pairs = mx.vmap(mx.random.split)(_stacked_keys(streams))  # [R, 2, 2]
        heads = pairs[:, 0]
        for row, stream in enumerate(streams):
            stream._key, stream._peeked, stream._stacked = heads[row], [], (heads, row)
        return pairs[:, 1]


def _stacked_keys(streams: Sequence[RowRng]) -> mx.array:
    """The streams' keys `[R, 2]`: the stack the tick before left them in where they are its rows
    in order, every one of them (the same values either way)."""
    first = streams[0]._stacked
    if first is not None and first[0].shape[0] == len(streams):
        stack = first[0]
        if all(s._stacked is not None and s._stacked[0] is stack and s._stacked[1] == r for r, s in enumerate(streams)):
            return stack
    return mx.stack([stream._key for stream in streams])


def _splits(key: mx.array, n: int) -> list[tuple[mx.array, mx.array]]:
    """(the stream's key after each of n draws, that draw's key), as `next_key` would make them."""
    out = []
    for _ in range(n):
        pair = mx.random.split(key)
        key = pair[0]
        out.append((key, pair[1]))
    return out
