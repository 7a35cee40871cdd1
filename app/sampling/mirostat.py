"""Mirostat 1 and 2: a truncation steered so that the row's surprise tracks a target (`tau` bits).

llama-server's chains under `mirostat` are bias, temperature, then this stage alone (no penalties,
top-k/p, min-p, XTC). The stage has state, `mu`: it starts at 2 tau and, after each decided token,
moves by `eta` times the token's surprise under the stage's row minus tau. So a verify row's `mu` is
the one the drafts before it would have left: `rows` chains it through the round's positions, and the
row state advances the settled `mu` with the tokens actually decided (`MirostatState.observe`).
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx

from app.sampling.distribution import Distribution

V1_SAMPLE = 100  # llama-server's m: the most probable tokens mirostat 1 fits its Zipf exponent on


def _surprise(probs: mx.array) -> mx.array:
    """Bits, -log2 p (infinite for p = 0)."""
    return -mx.log2(mx.where(probs > 0, probs, 0.0))


def _kept_v2(probs: mx.array, mu: mx.array) -> mx.array:
    """Mirostat 2 keeps the leading tokens whose surprise is at most mu (at least one)."""
    return mx.maximum(mx.sum(_surprise(probs) <= mu, axis=-1), 1)


def _kept_v1(probs: mx.array, mu: mx.array, vocab: int) -> mx.array:
    """Mirostat 1 keeps the top k, k from the Zipf exponent fitted on the leading V1_SAMPLE tokens."""
    head = probs[..., : min(V1_SAMPLE, probs.shape[-1])]
    i = mx.arange(head.shape[-1] - 1).astype(mx.float32)
    t = mx.log((i + 2) / (i + 1))
    valid = head[..., 1:] > 0  # a zero-probability neighbour carries no slope
    b = mx.log(mx.where(valid, head[..., :-1] / mx.where(valid, head[..., 1:], 1.0), 1.0))
    s_hat = mx.sum(mx.where(valid, t * b, 0.0), axis=-1) / mx.maximum(
        mx.sum(mx.where(valid, t * t, 0.0), axis=-1), 1e-30
    )
    epsilon = s_hat - 1
    k = mx.power((epsilon * mx.power(2.0, mu)) / (1 - mx.power(float(vocab), -epsilon)), 1 / s_hat)
    k = mx.where(mx.isnan(k), 1.0, mx.clip(k, 1.0, float(probs.shape[-1])))
    return k.astype(mx.int32)


def truncated(logits: mx.array, mu: mx.array, version: int, temperature: float, vocab: int) -> Distribution:
    """One row `[1, V]` of adjusted logits as mirostat's final row at `mu`."""
    order = mx.argsort(-logits, axis=-1)
    probs = mx.softmax(mx.take_along_axis(logits, order, axis=-1) / max(temperature, 1e-6), axis=-1)
    kept = _kept_v2(probs, mu) if version == 2 else _kept_v1(probs, mu, vocab)
    rank = mx.arange(probs.shape[-1])[None, :]
    kept_probs = mx.where(rank < kept, probs, 0.0)
    return Distribution(
        ids=order, probs=kept_probs / mx.sum(kept_probs, axis=-1, keepdims=True), vocab=logits.shape[-1]
    )


class MirostatState:
    """One row's settled mu (lazy, on the device)."""

    def __init__(self, version: int, tau: float, eta: float, temperature: float, vocab: int) -> None:
        self.version, self.tau, self.eta = version, tau, eta
        self.temperature, self.vocab = temperature, vocab
        self.mu = mx.array(2.0 * tau)

    def _step(self, mu: mx.array, row: Distribution | None, token: int) -> mx.array:
        """mu after `token` was decided from `row` (None: a token the grammar forced, surprise 0)."""
        surprise = mx.array(0.0) if row is None else _surprise(row.prob_of(mx.array([token])))[0]
        return mu - self.eta * (surprise - self.tau)

    def rows(self, logits: mx.array, previous: Sequence[int] | None) -> Distribution:
        """The final rows of consecutive positions `[R, V]`, mu chained from the settled one through
        `previous[r]` (the token before row r, r >= 1); None: every row at the settled mu."""
        mu, out = self.mu, []
        for r in range(logits.shape[0]):
            if r and previous is not None:
                mu = self._step(mu, out[-1], previous[r])
            out.append(truncated(logits[r : r + 1], mu, self.version, self.temperature, self.vocab))
        return Distribution.stack(out)

    def observe(self, rows: Distribution | None, tokens: Sequence[int]) -> None:
        """Settle mu past `tokens`, decided in order from `rows` (None: forced or greedy tokens)."""
        for i, token in enumerate(tokens):
            self.mu = self._step(self.mu, None if rows is None else rows[i], token)
        mx.async_eval(self.mu)  # cuts the chain of updates (no long graph) without a wait per row
