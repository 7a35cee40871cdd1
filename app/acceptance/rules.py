"""The acceptance rules, as functions over drafted tokens and probability rows.

Vocabulary (as in the speculative-sampling papers): a round drafts k tokens d_1..d_k; the
target's rows p_1..p_{k+1} come from one verify forward (row i is the distribution of the token
after d_{i-1}); the rule walks the chain and stops at its first rejection. It emits the accepted
drafts, then either a *recovered* token (on the rejection) or a *bonus* token (after a full
accept), so every round emits accepted + 1 tokens. `p` rows are the target's final rows from the
sampler pipeline; `q` rows are what the drafter actually drew from, through the same pipeline.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx

from app.sampling import Distribution


@dataclass(frozen=True)
class Verdict:
    """What a rule decided for one round."""

    accepted: int  # drafts accepted, a prefix of the chain
    tokens: list[int]  # emitted: the accepted drafts plus one recovered or bonus token
    tested: int  # positions tested: accepted, plus the rejecting one if any

    @property
    def rejected(self) -> bool:
        return self.tested > self.accepted


def _longest_matching_prefix(drafts: Sequence[int], reference: Sequence[int]) -> Verdict:
    n = 0
    while n < len(drafts) and drafts[n] == reference[n]:
        n += 1
    tested = n + 1 if n < len(drafts) else n
    return Verdict(accepted=n, tokens=[*drafts[:n], reference[n]], tested=tested)


def greedy_argmax(drafts: Sequence[int], target_argmax: Sequence[int]) -> Verdict:
    """Temperature 0: accept while the draft equals the target's argmax; emit the argmax after.

    Sampler-match where the sampler is argmax, so it is exactly greedy target decoding.
    `target_argmax` has k+1 entries (the last is the bonus after a full accept).
    """
    return _longest_matching_prefix(drafts, target_argmax)


def argmax_against_argmax(drafts: Sequence[int], target_argmax: Sequence[int]) -> Verdict:
    """The block loops' rule: compare with the target argmax whatever the temperature.

    Identical arithmetic to `greedy_argmax`, but run at T > 0 it serves the target's greedy
    stream instead of a sample from p, so it is biased there. Accepts with probability q(argmax p).
    """
    return _longest_matching_prefix(drafts, target_argmax)


def sampler_match(drafts: Sequence[int], drawn: Sequence[int]) -> Verdict:
    """Accept iff the draft equals a fresh draw from p; emit that draw on both branches.

    Lossless: every emitted token is a fresh conditional draw from the target. Accepts with
    probability sum_x p(x) q(x). `drawn` holds the k + 1 draws (the bonus included), made in one
    evaluation from p at the target stream's keys of those positions (`Distribution.draw_each`). The
    caller consumes the keys of the positions emitted (`len(verdict.tokens)`) and no more: each
    emitted token is the draw target-only decoding makes there, so a seeded row emits
    target-only's tokens whatever drafted them.
    """
    return _longest_matching_prefix(drafts, drawn)


@dataclass(frozen=True)
class RejectionDraws:
    """What the stochastic rule reads of a round, built lazily so that every row's are evaluated
    in one wait: per draft position its uniform u, p(d) and q(d), and the token the round ends on
    after each possible accepted count n (n < k: the recovered draw from relu(p - q) at position
    n; n = k: the bonus draw from p at k). Keys: `keys[i]` is the stream's i-th next key; the
    uniform of position i takes key i, the round's last draw key min(n + 1, k), so a round of n
    accepted drafts consumes `tested + 1` keys, as drawing them one by one would."""

    uniforms: mx.array  # [k]
    p_at: mx.array  # [k]
    q_at: mx.array  # [k]
    endings: mx.array  # [k + 1]

    @property
    def arrays(self) -> tuple[mx.array, ...]:
        return (self.uniforms, self.p_at, self.q_at, self.endings)


def rejection_draws(drafts: mx.array, p: Distribution, q: Distribution, keys: Sequence[mx.array]) -> RejectionDraws:
    """The lazy inputs of `modified_rejection` for the k `drafts`, from the target rows p `[k+1]`,
    the drafter rows q `[k]` and the stream's next k + 1 keys (`RowRng.peek`)."""
    k = int(drafts.shape[0])
    uniforms = mx.stack([mx.random.uniform(key=key) for key in keys[:k]])
    endings = []
    for n in range(k):
        residual = mx.maximum(p[n].dense() - q[n].dense(), 0.0)
        endings.append(Distribution.from_dense(residual / mx.sum(residual)).draw(keys[n + 1]))
    endings.append(p[k].draw(keys[k]))
    return RejectionDraws(uniforms, p[:k].prob_of(drafts), q.prob_of(drafts), mx.concatenate(endings))


def modified_rejection(
    drafts: Sequence[int], uniforms: Sequence[float], p_at: Sequence[float], q_at: Sequence[float],
    endings: Sequence[int],
) -> Verdict:  # fmt: skip
    """Leviathan et al. / Chen et al.: accept iff u * q(t) <= p(t), u ~ U[0, 1).

    On the first rejection emit a draw from normalize(relu(p - q)) and end the chain; after a
    full accept emit a bonus draw from p. Lossless because min(p, q) + relu(p - q) == p, and
    acceptance-optimal: it accepts with probability sum_x min(p(x), q(x)). Randomness: one
    uniform per verified position, then one categorical draw (the recovered or bonus token):
    `RejectionDraws` holds them all, evaluated; the caller consumes `tested + 1` keys.
    """
    k = len(drafts)
    n = 0
    while n < k and uniforms[n] * q_at[n] <= p_at[n]:
        n += 1
    return Verdict(accepted=n, tokens=[*drafts[:n], int(endings[n])], tested=n + 1 if n < k else k)


def sum_min(p: mx.array, q: mx.array) -> mx.array:
    """sum_x min(p, q) per row: the maximal-coupling ceiling, 1 - TV(p, q)."""
    return mx.sum(mx.minimum(p, q), axis=-1)


def sum_prod(p: mx.array, q: mx.array) -> mx.array:
    """sum_x p * q per row: how often an independent draw from p equals one from q."""
    return mx.sum(p * q, axis=-1)


RACE_TERMS = 64  # the closed form's tokens per row: q's most likely, enough for any top_k up to it


def sum_coupled(p: mx.array, q: mx.array, candidates: mx.array) -> mx.array:
    """How often a coupled draft equals the target's draw, per row: with one key's Gumbel noise
    over token ids (an exponential race), both draws are token i with probability
    1 / sum_x max(p(x) / p(i), q(x) / q(i)), summed here over the tokens both keep.

    `p`, `q` are dense rows `[R, V]`; `candidates` `[R, C]` the tokens i to sum over, q's most
    likely first. Each term is at most min(p(i), q(i)), so summing only the first RACE_TERMS
    undercounts by at most the q mass past them (none with top_k <= RACE_TERMS). At least
    (1 - TV) / (1 + TV), against the ceiling 1 - TV and sum_prod for independent drafts.
    """
    candidates = candidates[:, :RACE_TERMS]
    rows = []
    for r in range(p.shape[0]):  # [C, V] per row: the terms never hold more than one row's
        p_i, q_i = p[r][candidates[r]], q[r][candidates[r]]
        both = (p_i > 0) & (q_i > 0)
        scale_p, scale_q = mx.where(both, 1 / p_i, 0.0), mx.where(both, 1 / q_i, 0.0)
        race = mx.sum(mx.maximum(p[r][None, :] * scale_p[:, None], q[r][None, :] * scale_q[:, None]), axis=-1)
        rows.append(mx.sum(mx.where(both, 1 / mx.maximum(race, 1.0), 0.0)))
    return mx.stack(rows)
