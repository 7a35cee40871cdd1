"""A row's two key streams, the target sampler's and the drafter's, and the keys drafts draw with.

Target-only decoding consumes the row's stream (`RowRng`, the sequence `mx.random.seed(seed)`
starts) in one pattern: at every position it samples, the XTC coin's key when XTC is on, then the
categorical draw's key; at a position the grammar forces (one allowed token) nothing, whether the
token is jumped or decoded. A speculative row keeps that stream for the target's draws alone and
takes the keys of the very positions it emits (`position_keys`), so under sampler-match it emits
target-only's tokens at every width, in any batch.

A drafter never consumes the target stream. Coupled (`speculative.coupled`, sampler-match only),
its draft at position i draws with the keys the target's draw at position i will take, peeked
(`draft_keys`): both draws are Gumbel-max over token ids with the same noise
(`Distribution.draw`), so they agree wherever p and q are close, and the target's draw, hence every
emitted token, is unchanged. Uncoupled, and wherever a draft position is not that position of the
target's stream, it draws from a second stream derived from the seed (`drafter_stream`), which
target-only decoding never touches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx

from app.sampling.rng import KEY_RANGE, RowRng

# Any fixed odd 64-bit constant keeps the drafter's keys apart from the target's (2**64 / golden ratio).
DRAFTER_SALT = 0x9E3779B97F4A7C15


def drafter_stream(seed: int) -> RowRng:
    """The drafter's stream of the row seeded `seed`."""
    return RowRng((seed ^ DRAFTER_SALT) % KEY_RANGE)


def xtc_coins(rng: RowRng, rows: int, on: bool) -> mx.array | None:
    """One XTC coin per row `[rows]` from `rng`'s next keys (lazy); None, drawing nothing, when XTC is off."""
    if not on:
        return None
    return mx.stack([mx.random.uniform(key=rng.next_key()) for _ in range(rows)])


@dataclass
class PositionKeys:
    """The target stream's keys of the next positions, peeked: `consume(n)` once n are decided."""

    rng: RowRng
    coins: mx.array | None  # [R] XTC coins (None: XTC off); 1.0 at a forced row, which has nothing to exclude
    draws: list[mx.array | None]  # each row's draw key (`Distribution.draw_each`); None at a forced row
    spans: list[int]  # keys each position takes

    def consume(self, positions: int) -> None:
        self.rng.advance(sum(self.spans[:positions]))


def position_keys(rng: RowRng, sampled: Sequence[bool], coin: bool) -> PositionKeys:
    """The keys of len(sampled) positions, laid out as target-only decoding draws them;
    `sampled[i]` is False where the grammar forces position i; `coin`: XTC is on."""
    spans = [1 + coin if is_sampled else 0 for is_sampled in sampled]
    keys = iter(rng.peek(sum(spans)))
    coins, draws = [], []
    for is_sampled in sampled:
        coins.append(mx.random.uniform(key=next(keys)) if coin and is_sampled else mx.array(1.0))
        draws.append(next(keys) if is_sampled else None)
    return PositionKeys(rng, mx.stack(coins) if coin else None, draws, spans)


def sampled_rows(masks: mx.array | None, rows: int) -> list[bool]:
    """Which of `rows` positions sample: all, but those whose grammar mask `[rows, V]` allows one token."""
    if masks is None:
        return [True] * rows
    return (mx.sum(masks[:rows], axis=-1) != 1).tolist()


@dataclass
class DraftKeys:
    """The keys a row's drafts draw with, one draft position at a time (`take`).

    Coupled: `ahead` holds the target stream's next keys (peeked, never consumed), taken in
    target-only's layout, so draft position i gets exactly the coin and draw keys the target's
    verify draw at position i takes. Uncoupled (`ahead` None): the drafter stream's next keys.
    """

    drafter: RowRng
    coin: bool  # XTC is on: each sampled position takes a coin's key first
    ahead: list[mx.array] | None = None
    taken: int = 0  # keys of `ahead` the positions so far have taken

    def take(self, sampled: bool = True) -> tuple[mx.array | None, mx.array]:
        """(the XTC coin `[1]`, None with XTC off; the draw key) of the next draft position.

        `sampled` False: the grammar forces this position, where the target takes no key, so there
        is no key of the target's to share and the draft falls back to the drafter stream.
        """
        span = 1 + self.coin
        if self.ahead is None or not sampled:
            coin = xtc_coins(self.drafter, 1, self.coin)
            return coin, self.drafter.next_key()
        keys = self.ahead[self.taken : self.taken + span]
        self.taken += span
        coin = mx.random.uniform(key=keys[0])[None] if self.coin else None
        return coin, keys[-1]


def draft_keys(rng: RowRng, drafter: RowRng, width: int, coin: bool, coupled: bool) -> DraftKeys:
    """The keys of up to `width` draft positions: coupled, the target stream `rng`'s (peeked for
    `width` sampled positions); otherwise the drafter stream's. `coin`: XTC is on."""
    ahead = rng.ahead(width * (1 + coin)) if coupled else None
    return DraftKeys(drafter, coin, ahead)
