"""Probability rows kept on their candidate set: the tokens that survived top-k.

With top_k = 40 a row has 40 non-zero entries out of thousands; looking up in the candidates
costs a fraction of the dense row's work. A draw's noise covers the whole vocabulary (`draw`);
rows become dense only where a rule needs p and q aligned (the residual, the closed forms).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx

from app.execution.device import backend
from app.runtime.env import switch

STACKED_DRAWS = "MLXCEL_STACKED_DRAWS"  # set: stacked draws on or off whatever the device (`stacked_draws`)


def stacked_draws() -> bool:
    """Whether rows' draws are made stacked: `draw_each` in one graph, and a tick's rows of like
    samplers in one pass (app/sampling/draws.py). On the CPU and on CUDA, where the stacked rows
    are held to their lone bits (tests/sampling/test_draws.py, the seeded identity, the batched
    steps and the sampler guards, run on an H100 on 2026-12-07). Not on Metal, where no run has
    held them: its sorts, reductions and random bits may take other kernels for sixteen rows than
    for one, and a seeded row's tokens must not depend on its batch-mates, so there each row draws
    alone (correct by construction). MLXCEL_STACKED_DRAWS, when set, overrides the device's
    default: on (1, true, yes, on) or off (anything else)."""
    on = switch(STACKED_DRAWS)
    return backend().name != "metal" if on is None else on


def forced_rows(keys: Sequence[mx.array | None] | mx.array) -> list[bool]:
    """Which rows are forced (no key: the grammar allows one token); none of keys stacked `[R, 2]`."""
    return [False] * keys.shape[0] if isinstance(keys, mx.array) else [key is None for key in keys]


def stacked_keys(keys: Sequence[mx.array | None] | mx.array) -> tuple[mx.array | None, list[bool]]:
    """Rows' draw keys stacked `[R, 2]` (a forced row's is any other row's: its draw is discarded
    for its top candidate), None where every row is forced; and which rows are forced."""
    forced = forced_rows(keys)
    if isinstance(keys, mx.array):
        return keys, forced
    stand_in = next((key for key in keys if key is not None), None)
    if stand_in is None:
        return None, forced
    return mx.stack([stand_in if key is None else key for key in keys]), forced


@dataclass(frozen=True)
class Distribution:
    """R rows over C candidates each: row r gives probability `probs[r, c]` to `ids[r, c]`."""

    ids: mx.array  # [R, C] token ids
    probs: mx.array  # [R, C] probabilities summing to 1 per row
    vocab: int

    @classmethod
    def from_dense(cls, rows: mx.array) -> Distribution:
        """Wrap dense rows `[R, V]` (every token is a candidate)."""
        rows = rows if rows.ndim == 2 else rows[None, :]
        ids = mx.broadcast_to(mx.arange(rows.shape[-1])[None, :], rows.shape)
        return cls(ids=ids, probs=rows, vocab=rows.shape[-1])

    @property
    def rows(self) -> int:
        return self.ids.shape[0]

    def __getitem__(self, index: int | slice) -> Distribution:
        if isinstance(index, int):
            index = slice(index, index + 1)
        return Distribution(self.ids[index], self.probs[index], self.vocab)

    def dense(self) -> mx.array:
        """The rows over the whole vocabulary `[R, V]`."""
        zeros = mx.zeros((self.rows, self.vocab), dtype=self.probs.dtype)
        return mx.put_along_axis(zeros, self.ids, self.probs, axis=-1)

    def prob_of(self, tokens: mx.array) -> mx.array:
        """Probability of `tokens[r]` under row r `[R]`."""
        return mx.sum(mx.where(self.ids == tokens[:, None], self.probs, 0.0), axis=-1)

    def within(self, masks: mx.array) -> Distribution:
        """Each row restricted to the tokens its mask `[R, V]` (bool) allows, renormalised."""
        allowed = mx.take_along_axis(masks, self.ids, axis=-1)
        kept = mx.where(allowed, self.probs, 0.0)
        return Distribution(self.ids, kept / mx.sum(kept, axis=-1, keepdims=True), self.vocab)

    def draw(self, key: mx.array) -> mx.array:
        """One token per row `[R]` (lazy): Gumbel-max over token ids, the argmax of log p(x) + G[x]
        over the candidates, G the key's Gumbel noise over the whole vocabulary `[R, V]`.

        The noise is indexed by token id, not by a candidate's rank, so two rows drawn with one key
        share the noise of every token both keep, whatever their candidate sets: a coupled draft
        agrees with the target's draw wherever their distributions are close (app/sampling/streams.py).
        A tie goes to the lowest id, so the token does not depend on the candidates' order either.
        """
        return self._gumbel_max(mx.random.gumbel(shape=(self.rows, self.vocab), key=key))

    def draw_each(self, keys: Sequence[mx.array | None] | mx.array) -> mx.array:
        """One token per row `[R]` (lazy), row r drawn with its own key `keys[r]` exactly as
        `self[r].draw(keys[r])` draws it, every row in one graph (a tick's rows of like samplers,
        app/sampling/draws.py); None: a forced row, which takes its top candidate. `keys` may come
        stacked `[R, 2]` already (`RowRng.next_keys`: no row forced).

        The rows' noises come from one vectorised draw: MLX's random bits of a stack of keys are
        each key's own bits, so row r's noise is its lone `[1, V]` draw's, bit for bit."""
        if not stacked_draws():  # each row its lone draw, one after another (Metal)
            rows = [
                self.ids[i : i + 1, 0] if forced else self[i].draw(keys[i])
                for i, forced in enumerate(forced_rows(keys))
            ]
            return mx.concatenate(rows)
        stacked, forced = stacked_keys(keys)
        if stacked is None:
            return self.forced_to_top(None, forced)
        noise = mx.vmap(lambda key: mx.random.gumbel(shape=(1, self.vocab), key=key))(stacked)
        return self.forced_to_top(self._gumbel_max(noise.reshape(self.rows, self.vocab)), forced)

    def forced_to_top(self, drawn: mx.array | None, forced: Sequence[bool]) -> mx.array:
        """The rows' tokens: `drawn` `[R]` (None: no row drew), each forced row's its top candidate."""
        if drawn is None:
            return self.ids[:, 0]
        return mx.where(mx.array(forced), self.ids[:, 0], drawn) if any(forced) else drawn

    def _gumbel_max(self, noise: mx.array) -> mx.array:
        """The argmax of log p + noise over each row's candidates, `noise` `[R, V]` by token id."""
        scores = mx.log(self.probs) + mx.take_along_axis(noise, self.ids, axis=-1)
        best = mx.max(scores, axis=-1, keepdims=True)
        return mx.min(mx.where(scores == best, self.ids, self.vocab), axis=-1)

    @classmethod
    def stack(cls, parts: list[Distribution]) -> Distribution:
        """Rows of several distributions over candidate sets of the same size, in order."""
        ids = mx.concatenate([part.ids for part in parts])
        return cls(ids=ids, probs=mx.concatenate([part.probs for part in parts]), vocab=parts[0].vocab)
